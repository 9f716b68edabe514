"""Run an ASGI app with uvicorn in a background thread (tests, notebooks): ``with serve_in_thread(app) as url``."""

from __future__ import annotations

import contextlib
import threading
import time

from engine.server.router import free_port


@contextlib.contextmanager
def serve_in_thread(app, host: str = "127.0.0.1", port: int | None = None, timeout: float = 30.0):
    import uvicorn

    port = port or free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server on {host}:{port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
