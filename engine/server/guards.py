"""What stands between the network and the handlers, for the server and the router alike: OpenAI error objects for
every error (404, 405, 422, 500 included, never an exception's internals), header limits (431), the request body
limit (413), bearer-token auth on ``/v1/*`` (401) and CORS."""

from __future__ import annotations

import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.server.config import ServerConfig
from engine.server.protocol import APIError

log = logging.getLogger("splitfuse.server")

JSON_TYPES = ("application/json",)


def error_response(e: APIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def fastapi_options(config: ServerConfig) -> dict:
    """``FastAPI(**these)``: no docs routes with ``--disable-fastapi-docs``."""
    return dict(docs_url=None, redoc_url=None, openapi_url=None) if config.disable_fastapi_docs else {}


class _Guard:
    """A pure ASGI middleware over HTTP requests: ``reject`` returns an ``APIError`` to answer instead, or None."""

    def __init__(self, app, config: ServerConfig) -> None:
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            error = self.reject(scope)
            if error is not None:
                headers = {"www-authenticate": "Bearer"} if error.status == 401 else None
                return await error_response(error, headers)(scope, receive, send)
            receive = self.wrap_receive(scope, receive)
        await self.app(scope, receive, send)

    def reject(self, scope) -> APIError | None:
        return None

    def wrap_receive(self, scope, receive):
        return receive


class HeaderLimits(_Guard):
    """431 for a request whose line + headers exceed ``h11_max_incomplete_event_size`` bytes or whose header
    count exceeds ``h11_max_header_count`` (h11 itself enforces the size only while headers arrive in pieces)."""

    def reject(self, scope):
        headers = scope["headers"]
        size = len(scope.get("raw_path") or b"") + sum(len(k) + len(v) + 4 for k, v in headers)
        if len(headers) > self.config.h11_max_header_count:
            return APIError(f"too many request headers ({len(headers)} > {self.config.h11_max_header_count})",
                            status=431, param="headers")
        if size > self.config.h11_max_incomplete_event_size:
            return APIError(f"request headers too large ({size} > {self.config.h11_max_incomplete_event_size} "
                            f"bytes)", status=431, param="headers")
        return None


class BodyLimit(_Guard):
    """413 for a body over ``max_request_body_bytes``: at once by its Content-Length, else when the bytes read
    pass the limit (chunked uploads); 415 for a POST whose Content-Type is not JSON (none counts as JSON, as in
    FastAPI)."""

    def reject(self, scope):
        limit = self.config.max_request_body_bytes
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return APIError(f"request body is {int(length)} bytes, more than the limit of {limit} "
                            f"(--max-request-body-bytes)", status=413, param="body")
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1").lower()
        if scope["method"] == "POST" and ctype and ctype not in JSON_TYPES and not ctype.endswith("+json"):
            return APIError(f"Content-Type must be application/json, got {ctype!r}", status=415,
                            param="content-type")
        return None

    def wrap_receive(self, scope, receive):
        limit, seen = self.config.max_request_body_bytes, 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise APIError(f"request body is more than the limit of {limit} bytes (--max-request-body-bytes)",
                               status=413, param="body")
            return message

        return counted


class APIKeyAuth(_Guard):
    """401 on ``/v1/*`` without ``Authorization: Bearer <api_key>`` (vLLM's ``--api-key``)."""

    def reject(self, scope):
        if not scope["path"].startswith("/v1/") or scope["method"] == "OPTIONS":
            return None
        given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        expected = f"Bearer {self.config.api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return APIError("invalid or missing API key (send 'Authorization: Bearer <key>')", status=401,
                            type="authentication_error")
        return None


def install_guards(app: FastAPI, config: ServerConfig) -> None:
    """The error handlers and middleware above on ``app``, outermost first: CORS, header limits, auth, body limit."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {e.detail}"
        return error_response(APIError(message, status=e.status_code, type=kind), headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(APIError(f"invalid request: {first.get('msg', 'validation failed')}", param=param,
                                       status=422))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(APIError("internal server error; see the server's log", status=500,
                                       type="server_error"))

    app.add_middleware(BodyLimit, config=config)
    if config.api_key:
        app.add_middleware(APIKeyAuth, config=config)
    app.add_middleware(HeaderLimits, config=config)
    app.add_middleware(CORSMiddleware, allow_origins=config.cors_list("allowed_origins"),
                       allow_methods=config.cors_list("allowed_methods"),
                       allow_headers=config.cors_list("allowed_headers"),
                       allow_credentials=config.allow_credentials)
