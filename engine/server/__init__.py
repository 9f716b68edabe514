"""The persistent deployment: an OpenAI-compatible HTTP server over one engine, a router over replicas, and a
benchmark client.

- ``engine_loop``: ``AsyncEngine``, the asyncio loop that owns an ``LLMEngine``, runs ``step()`` in a worker
  thread and streams tokens to per-request queues (join and leave at every pass, abort on disconnect, 429
  when the waiting queue is full).
- ``engine_process``: ``ProcessEngine``, the same interface over an engine in its own process (the default of
  ``splitfuse serve``; ``--no-engine-process`` keeps the thread): add/abort go over a pipe, each pass's new
  tokens and the engine's stats come back in one message, so HTTP streaming never holds the engine's GIL.
- ``protocol``: OpenAI request bodies, their validation, and OpenAI-style error bodies (400 naming the field).
- ``detokenize``: incremental detokenization and stop strings.
- ``metrics``: Prometheus text exposition (histograms, counters, gauges) without a client library.
- ``app``: the FastAPI app (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
  ``/metrics``).
- ``router``: replica processes behind a router that picks with ``engine.policy.load_balancer`` (the simulator's
  policies), health checks, retries where no token was sent yet.
- ``cli``: ``splitfuse serve``; ``bench``: ``splitfuse bench``; ``bench_metrics``: its latency metrics.

Importing this package imports neither torch nor FastAPI; each module pulls in what it needs.
"""
