"""``ServerConfig``: the HTTP side of ``splitfuse serve`` (limits, auth, CORS, shutdown, supervision), with the
defaults written once; the command's flags are made from its fields (``engine.policy.options``), named as vLLM and
uvicorn name them where they have the option."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from engine.policy.config import option_metadata

# How long this project's HTTP clients (the router's to its replicas, `splitfuse bench`'s) keep an idle connection:
# well under a server's keep-alive timeout (``ServerConfig.timeout_keep_alive``, 5 s as in uvicorn and vLLM). At
# equal timeouts a client may reuse a connection the server is closing and get a ReadError; one that lags a stream's
# end by more than the gap still may (``stale_connection``).
CLIENT_KEEPALIVE_EXPIRY_S = 2.0

API_KEY_ENV = "VLLM_API_KEY"  # read when --api-key is not given, as vLLM does


def stale_connection(error: BaseException) -> bool:
    """Whether ``error``, raised before a server answered a request, is a kept-alive connection closed as the
    request went out. A server's keep-alive clock starts when it has written a response, a client's when it has read
    it, so a client that lags a stream's end by more than the gap reuses a connection the server is closing: it gets
    the close (RemoteProtocolError) or, where the request reached the closed socket, a reset (ReadError). A server
    that closed the connection read none of the request, so a client sends it once more on another connection
    (``sim.bench.send``, ``Router.open``), as HTTP clients do with a request on a reused connection that got no
    answer."""
    import httpx

    return isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError))


@dataclass(frozen=True)
class ServerConfig:
    api_key: str | None = field(default=None, metadata=option_metadata(
        f"Require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV} when set)."))
    allowed_origins: str = field(default="*", metadata=option_metadata(
        "CORS origins: a JSON list or comma-separated ('*' for any)."))
    allowed_methods: str = field(default="*", metadata=option_metadata("CORS methods (JSON list or comma-separated)."))
    allowed_headers: str = field(default="*", metadata=option_metadata("CORS headers (JSON list or comma-separated)."))
    allow_credentials: bool = field(default=False, metadata=option_metadata(
        "CORS: allow credentials.", "--allow-credentials"))
    disable_fastapi_docs: bool = field(default=False, metadata=option_metadata(
        "No /docs, /redoc or /openapi.json.", "--disable-fastapi-docs"))
    max_request_body_bytes: int = field(default=16 << 20, metadata=option_metadata(
        "Largest request body; larger ones answer 413 before they are read."))
    h11_max_incomplete_event_size: int = field(default=16 << 10, metadata=option_metadata(
        "Largest request line + headers in bytes (uvicorn's h11 option); larger ones answer 431."))
    h11_max_header_count: int = field(default=256, metadata=option_metadata(
        "Most header lines a request may carry; more answer 431."))
    timeout_keep_alive: float = field(default=5.0, metadata=option_metadata(
        "Seconds an idle connection is kept, and that a client has to send a request's headers (slow or "
        "half-sent ones are closed)."))
    limit_concurrency: int | None = field(default=None, metadata=option_metadata(
        "Most open connections; beyond it new ones get 503 and are closed (uvicorn's option)."))
    shutdown_timeout: float = field(default=20.0, metadata=option_metadata(
        "On SIGTERM: seconds in-flight requests may finish; the rest end with finish_reason 'abort'."))
    max_replica_restarts: int = field(default=5, metadata=option_metadata(
        "Router: times a dead replica is restarted (backoff 1, 2, 4 ... 30 s) before it stays out."))

    def cors_list(self, name: str) -> list[str]:
        """``allowed_origins`` & co. as a list (they arrive as a JSON list or comma-separated)."""
        text = getattr(self, name).strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"--{name.replace('_', '-')} is not a JSON list: {e.msg}") from None
            return [str(x) for x in items]
        return [x.strip() for x in text.split(",") if x.strip()]

    def check(self) -> None:
        """ValueError naming the first option out of range."""
        for name in ("max_request_body_bytes", "h11_max_incomplete_event_size", "h11_max_header_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise ValueError("--limit-concurrency must be >= 1")
        for name in ("timeout_keep_alive", "shutdown_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
            self.cors_list(name)
