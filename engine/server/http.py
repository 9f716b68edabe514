"""Running an app under uvicorn with the connection-level limits of ``ServerConfig``, and a graceful stop.

- ``GuardedH11Protocol``: uvicorn's h11 protocol plus a header deadline (a connection that has not sent a
  complete request head within ``timeout_keep_alive`` seconds of opening, or of its last response, is closed:
  slow or half-sent headers hold no file descriptor for long) and ``limit_concurrency`` counted on open
  connections (beyond it a new connection gets one 503 in the OpenAI error object and is closed, without a log
  line each).
- ``GracefulServer``: on SIGTERM/SIGINT it tells the service to drain (``begin_drain``: finish in-flight requests
  within ``shutdown_timeout``, then end the rest with ``finish_reason`` "abort"), and stops. A service may call
  ``fail()`` (its engine died): the server stops and ``run_http`` returns 1, so a supervisor restarts it.
"""

from __future__ import annotations

import json
import resource

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.server.config import ServerConfig
from engine.server.protocol import APIError

DRAIN_MARGIN_S = 5.0  # beyond shutdown_timeout: time for the aborted streams to send their last events


def _raw_503() -> bytes:
    body = json.dumps(APIError("too many open connections (--limit-concurrency); retry later", status=503,
                               type="server_error").body()).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class GuardedH11Protocol(H11Protocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_connections = self.limit_concurrency
        self.limit_concurrency = None  # counted here on connections, not per request by the parent
        self.header_deadline = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            transport.write(_raw_503())
            transport.close()
            return
        self._arm_header_deadline()

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_deadline(self) -> None:
        if self.header_deadline is None and not self.transport.is_closing():
            self.header_deadline = self.loop.call_later(self.timeout_keep_alive, self._header_timeout)

    def _disarm_header_deadline(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _header_timeout(self) -> None:
        self.header_deadline = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_head():
            self._arm_header_deadline()  # not re-armed by each byte: a trickling client gets no more time
        else:
            self._disarm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm_header_deadline()  # the parent's keep-alive timer covers the idle wait now

    def connection_lost(self, exc) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.service, self.shutdown_timeout, self.exit_code = service, shutdown_timeout, 0

    def fail(self) -> None:
        """Stop serving and exit non-zero (the engine died; a supervisor restarts the server)."""
        self.exit_code = 1
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        if self.service is not None:
            self.service.begin_drain(0.0 if self.exit_code else self.shutdown_timeout)
        await super().shutdown(sockets)


def raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard one: many connections run out of descriptors later."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16),
                                                    hard))


def make_server(app, host: str, port: int, log_level: str, config: ServerConfig, service=None) -> GracefulServer:
    """A uvicorn server for ``app`` with ``config``'s limits; ``service`` (``begin_drain(timeout)``, optional
    ``on_fatal``) is told when to drain, and gets ``on_fatal`` set to stop the server with exit code 1."""
    uv = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=GuardedH11Protocol,
                        timeout_keep_alive=config.timeout_keep_alive, limit_concurrency=config.limit_concurrency,
                        h11_max_incomplete_event_size=config.h11_max_incomplete_event_size,
                        timeout_graceful_shutdown=config.shutdown_timeout + DRAIN_MARGIN_S)
    server = GracefulServer(uv, service, config.shutdown_timeout)
    if service is not None:
        service.on_fatal = server.fail
    return server


def run_http(app, host: str, port: int, log_level: str, config: ServerConfig, service=None) -> int:
    """Serve until SIGTERM/SIGINT (then drain) or the service's ``on_fatal``; the exit code (0, or 1 after a
    fatal error)."""
    raise_fd_limit()
    server = make_server(app, host, port, log_level, config, service)
    server.run()
    return server.exit_code
