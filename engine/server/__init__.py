"""The persistent deployment: an OpenAI-compatible HTTP server over one engine, and a router over replicas.

- ``engine_core``: the engine loop (vLLM's engine core), in a process of its own or a thread: commands in, one
  pass, that pass's tokens and the engine's stats out.
- ``engine_client``: ``EngineClient``, the API side of that loop: add/abort over a pipe, per-request token
  streams, 429 when the waiting queue is full, 503 when the engine is gone.
- ``protocol``: OpenAI request bodies, their validation, and OpenAI-style error bodies (400 naming the field).
- ``metrics``: Prometheus metrics (prometheus_client) under vLLM's names; the router's aggregation.
- ``config``: ``ServerConfig``, the HTTP options (limits, auth, CORS, shutdown, supervision) and their defaults.
- ``guards``: OpenAI error objects for every error, header (431) and body (413/415) limits, API key, CORS.
- ``http``: uvicorn with a header deadline and a connection limit, and a graceful drain on SIGTERM.
- ``workers``: the process that parses big request bodies off the API process's GIL.
- ``app``: the FastAPI app (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
  ``/metrics``).
- ``router``: replica processes behind a router that picks with ``engine.policy.load_balancer`` (the
  simulator's policies), health checks, retries where no token was sent yet, restarts of dead replicas.
- ``cli``: ``splitfuse serve``. The benchmark client, ``splitfuse bench``, is the simulator's (``sim.bench``).

Importing this package imports neither torch nor FastAPI; each module pulls in what it needs.
"""
