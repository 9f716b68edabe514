"""The OpenAI-compatible FastAPI app over one ``LLMEngine``: completions and chat (streaming or not), models,
health and Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from engine.detokenize import Detokenizer
from engine.prompts import check_prompt
from engine.server.engine_client import EngineClient, EngineDead, QueueFull, RequestStream
from engine.server.engine_core import EngineSpec
from engine.server.metrics import CONTENT_TYPE
from engine.server.protocol import APIError, ChatRequest, CompletionRequest, parse_body

DISCONNECT_POLL_S = 0.2


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _sse(obj) -> bytes:
    # ASCII escapes: a raw U+2028 or U+0085 in the JSON would split the line for clients that read SSE with
    # str.splitlines semantics (httpx aiter_lines, seen failing a test).
    return f"data: {json.dumps(obj)}\n\n".encode()


def render_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat: the tokenizer's chat template when it has one, else a plain 'role: content' form."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return list(tokenizer(text)["input_ids"])


class Server:
    """Turns validated OpenAI requests into engine requests and engine outputs into OpenAI responses."""

    def __init__(self, engine, model_name: str, max_waiting: int = 1024) -> None:
        """``engine``: an ``EngineSpec`` (the engine runs in its own process, started now) or an ``LLMEngine``
        (its loop runs in a thread of this process)."""
        self.model_name = model_name
        self.loop = EngineClient(engine, max_waiting=max_waiting)
        info = self.loop.launch()
        override = engine.tokenizer if isinstance(engine, EngineSpec) else None
        self.tokenizer = override if override is not None else info["tokenizer"]
        self.max_model_len, self.vocab_size = info["max_model_len"], info["vocab_size"]

    def tokenize(self, prompt) -> list[int]:
        return check_prompt(prompt, self.tokenizer, self.vocab_size)

    # -- request -> engine -----------------------------------------------------------------------------------
    def _check_model(self, body) -> None:
        if body.model != self.model_name:
            raise APIError(f"unknown model {body.model!r}; this server serves {self.model_name!r}",
                           param="model", type="invalid_request_error")

    def _prompt_ids(self, body, field: str) -> list[int]:
        if isinstance(body, ChatRequest):
            if self.tokenizer is None:
                raise APIError("this model has no tokenizer, so chat is unavailable; use /v1/completions with "
                               "token ids", param="messages")
            ids = render_chat(self.tokenizer, [{"role": m.role, "content": m.text()} for m in body.messages])
        else:
            try:
                ids = self.tokenize(body.single_prompt())
            except ValueError as e:
                raise APIError(str(e), param=field) from None
        if len(ids) >= self.max_model_len:
            raise APIError(f"{field} has {len(ids)} tokens but the model's context is {self.max_model_len} "
                           f"(prompt + at least one new token must fit)", param=field)
        return ids

    async def submit(self, body, field: str) -> tuple[RequestStream, list[int]]:
        self._check_model(body)
        ids = self._prompt_ids(body, field)
        max_tokens = body.max_tokens
        if isinstance(body, ChatRequest):
            max_tokens = body.max_completion_tokens or max_tokens or self.max_model_len - len(ids)
        params = body.sampling_params(max_tokens or 16)
        prefix = "chatcmpl" if isinstance(body, ChatRequest) else "cmpl"
        try:
            stream = await self.loop.add(ids, params, request_id=f"{prefix}-{uuid.uuid4().hex}")
        except ValueError as e:  # e.g. prompt + output can never fit the KV cache
            raise APIError(str(e), param=field) from None
        except QueueFull as e:
            raise APIError(str(e), status=429, type="rate_limit_error") from None
        except EngineDead as e:
            raise APIError(str(e), status=503, type="server_error") from None
        return stream, ids

    # -- engine -> response ----------------------------------------------------------------------------------
    def _choice(self, chat: bool, text: str, token_ids: list[int], finish_reason, first: bool) -> dict:
        if chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason,
                    "token_ids": token_ids}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "token_ids": token_ids}

    async def stream_response(self, stream: RequestStream, body, chat: bool):
        """SSE events; aborts the request if the client goes away (this generator is closed or cancelled)."""
        detok = Detokenizer(self.tokenizer, body.stop_strings)
        created, n_out, first = int(time.time()), 0, True
        head = {"id": stream.request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": self.model_name}
        try:
            async for out in stream:
                n_out += len(out.token_ids)
                text = detok.add(out.token_ids, final=out.finished)
                reason = out.finish_reason
                if detok.stopped and not out.finished:
                    self.loop.abort(stream.request_id)
                    reason = "stop"
                yield _sse({**head, "choices": [self._choice(chat, text, out.token_ids, reason, first)]})
                first = False
                if reason is not None:
                    break
            if body.include_usage:
                yield _sse({**head, "choices": [], "usage": self._usage(stream, n_out)})
            yield b"data: [DONE]\n\n"
        except EngineDead as e:
            yield _sse(APIError(str(e), status=503, type="server_error").body())
        finally:
            if not stream.finished:
                self.loop.abort(stream.request_id)

    async def full_response(self, stream: RequestStream, body, chat: bool, request: Request) -> JSONResponse:
        detok = Detokenizer(self.tokenizer, body.stop_strings)
        token_ids, text, reason = [], "", None
        collect = asyncio.ensure_future(self._collect(stream, detok, token_ids))
        try:
            while not collect.done():
                await asyncio.wait({collect}, timeout=DISCONNECT_POLL_S)
                if not collect.done() and await request.is_disconnected():
                    collect.cancel()
                    return JSONResponse({}, status_code=499)
            text, reason = collect.result()
        except EngineDead as e:
            return _error(APIError(str(e), status=503, type="server_error"))
        finally:
            if not stream.finished:
                self.loop.abort(stream.request_id)
            collect.cancel()
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason, "token_ids": token_ids}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "token_ids": token_ids}
        return JSONResponse({"id": stream.request_id, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": self.model_name, "choices": [choice],
                             "usage": self._usage(stream, len(token_ids))})

    async def _collect(self, stream: RequestStream, detok: Detokenizer, token_ids: list[int]):
        parts = []
        async for out in stream:
            token_ids += out.token_ids
            parts.append(detok.add(out.token_ids, final=out.finished))
            if detok.stopped and not out.finished:
                self.loop.abort(stream.request_id)
                return "".join(parts), "stop"
            if out.finished:
                return "".join(parts), out.finish_reason
        raise EngineDead("the request ended without a result")

    @staticmethod
    def _usage(stream: RequestStream, n_out: int) -> dict:
        return {"prompt_tokens": stream.num_prompt_tokens, "completion_tokens": n_out,
                "total_tokens": stream.num_prompt_tokens + n_out}

    async def handle(self, request: Request, cls, chat: bool):
        field = "messages" if chat else "prompt"
        try:
            body = parse_body(await request.body(), cls)
            stream, _ = await self.submit(body, field)
        except APIError as e:
            return _error(e)
        if body.stream:
            return StreamingResponse(self.stream_response(stream, body, chat), media_type="text/event-stream")
        return await self.full_response(stream, body, chat, request)


def create_app(engine, model_name: str, max_waiting: int = 1024) -> FastAPI:
    """The app over ``engine`` (an ``EngineSpec``: the engine process is started now; or an ``LLMEngine``,
    whose loop runs in a thread), served as ``model_name``."""
    server = Server(engine, model_name, max_waiting)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await server.loop.start()
        yield
        await server.loop.stop()

    app = FastAPI(title="splitfuse", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        return _error(APIError(f"internal error: {e!r}", status=500, type="server_error"))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.handle(request, CompletionRequest, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.handle(request, ChatRequest, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "splitfuse",
            "max_model_len": server.max_model_len, "vocab_size": server.vocab_size}]}

    @app.get("/health")
    async def health():
        if server.loop.error is not None:
            return JSONResponse({"status": "error", "error": repr(server.loop.error)}, status_code=503)
        return {"status": "ok", **server.loop.stats()}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.loop.metrics.render(), media_type=CONTENT_TYPE)

    return app
