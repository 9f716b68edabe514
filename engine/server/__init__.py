"""The persistent deployment: an OpenAI-compatible HTTP server over one engine, and a router over replicas.

- ``engine_core``: the engine loop (vLLM's engine core), in a process of its own or a thread: commands in, one
  pass, that pass's tokens and the engine's stats out.
- ``engine_client``: ``EngineClient``, the API side of that loop: add/abort over a pipe, per-request token
  streams, 429 when the waiting queue is full, 503 when the engine is gone.
- ``protocol``: OpenAI request bodies, their validation, and OpenAI-style error bodies (400 naming the field).
- ``metrics``: Prometheus text exposition (histograms, counters, gauges).
- ``app``: the FastAPI app (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
  ``/metrics``).
- ``router``: replica processes behind a router that picks with ``engine.policy.load_balancer`` (the
  simulator's policies), health checks, retries where no token was sent yet.
- ``cli``: ``splitfuse serve``. The benchmark client, ``splitfuse bench``, is the simulator's (``sim.bench``).

Importing this package imports neither torch nor FastAPI; each module pulls in what it needs.
"""
