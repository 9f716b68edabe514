"""The OpenAI-compatible FastAPI app over one ``LLMEngine``: completions and chat (streaming or not), models,
health and Prometheus metrics; errors, limits, auth and CORS from ``guards``, a graceful drain on shutdown."""

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
from engine.server.config import ServerConfig
from engine.server.engine_client import EngineClient, EngineDead, QueueFull, RequestStream, ServerShutdown
from engine.server.engine_core import EngineSpec
from engine.server.guards import error_response, fastapi_options, install_guards
from engine.server.heap import freeze_startup_heap, unfreeze_heap
from engine.server.metrics import CONTENT_TYPE
from engine.server.protocol import APIError, ChatRequest, CompletionRequest, parse_checked
from engine.server.workers import ParserPool

DISCONNECT_POLL_S = 0.2
OFFLOAD_BYTES = 64 << 10  # larger bodies: parsed in a worker process, tokenized in a thread (off the event loop)


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


async def off_loop(big: bool, fn, *args):
    """``fn(*args)``, in a worker thread when the input is big (the event loop keeps answering meanwhile)."""
    return await asyncio.to_thread(fn, *args) if big else fn(*args)


class Server:
    """Turns validated OpenAI requests into engine requests and engine outputs into OpenAI responses."""

    def __init__(self, engine, model_name: str, max_waiting: int = 1024, aliases: tuple[str, ...] = ()) -> None:
        """``engine``: an ``EngineSpec`` (the engine runs in its own process, started now) or an ``LLMEngine``
        (its loop runs in a thread of this process). Requests name ``model_name`` or one of ``aliases`` (e.g. the
        model's path); responses show ``model_name``."""
        self.model_name = model_name
        self.names = {model_name, *aliases}
        self.draining = False
        self.on_fatal = None  # set by the HTTP server: stop it, exit non-zero (the engine died)
        self.loop = EngineClient(engine, max_waiting=max_waiting, model_name=model_name)
        self.loop.on_dead = self._engine_died
        info = self.loop.launch()
        override = engine.tokenizer if isinstance(engine, EngineSpec) else None
        self.tokenizer = override if override is not None else info["tokenizer"]
        self.max_model_len, self.vocab_size = info["max_model_len"], info["vocab_size"]
        self._token_chars: tuple[object, int] = (None, 0)  # (tokenizer, its longest vocabulary entry)
        self.parsers = ParserPool()

    def tokenize(self, prompt) -> list[int]:
        return check_prompt(prompt, self.tokenizer, self.vocab_size)

    # -- life cycle ------------------------------------------------------------------------------------------
    def _engine_died(self) -> None:
        if self.on_fatal is not None:
            self.on_fatal()

    def begin_drain(self, timeout: float) -> None:
        """Stop taking requests (503); those in flight may finish for ``timeout`` seconds, then end with
        finish_reason "abort" (streams) or a 503 (non-streaming)."""
        self.draining = True

        def cut():
            self.loop.abort_all(ServerShutdown(f"the server shut down before the request finished "
                                               f"(--shutdown-timeout {timeout:g} s)"))

        asyncio.get_running_loop().call_later(timeout, cut)

    # -- request -> engine -----------------------------------------------------------------------------------
    def _check_model(self, body) -> None:
        if body.model not in self.names:
            raise APIError(f"The model `{body.model}` does not exist; this server serves {self.model_name!r}",
                           param="model", status=404, type="not_found_error")

    def max_prompt_chars(self) -> int | None:
        """Most characters a prompt that fits the context can have: no token of this tokenizer is longer than its
        longest vocabulary entry, and a 4x slack covers normalizers that drop characters. A longer text is refused
        before tokenizing (10 MB take many seconds of CPU)."""
        if self.tokenizer is None:
            return None
        if self._token_chars[0] is not self.tokenizer:
            vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
            self._token_chars = (self.tokenizer, max(map(len, vocab), default=64))
        return self.max_model_len * self._token_chars[1] * 4

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

    def _max_tokens(self, body, n_prompt: int) -> tuple[int, str]:
        """The request's output cap and the field it came from, checked against the context."""
        name, max_tokens = "max_tokens", body.max_tokens
        if isinstance(body, ChatRequest):
            if body.max_completion_tokens is not None:
                name, max_tokens = "max_completion_tokens", body.max_completion_tokens
            max_tokens = max_tokens or self.max_model_len - n_prompt
        max_tokens = max_tokens or min(16, self.max_model_len - n_prompt)
        if n_prompt + max_tokens > self.max_model_len:
            raise APIError(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                           f"requested {n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} in "
                           f"the completion). Reduce the prompt or {name}.", param=name)
        return max_tokens, name

    def _stop_token_ids(self, body) -> None:
        bad = [t for t in body.stop_token_ids or [] if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(f"stop_token_ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}",
                           param="stop_token_ids")

    async def submit(self, body, field: str, big: bool = False) -> tuple[RequestStream, list[int]]:
        if self.draining:
            raise APIError("the server is shutting down", status=503, type="server_error")
        self._check_model(body)
        self._stop_token_ids(body)
        ids = await off_loop(big, self._prompt_ids, body, field)
        max_tokens, _ = self._max_tokens(body, len(ids))
        params = body.sampling_params(max_tokens)
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
        except EngineDead as e:  # the engine died, or the server stopped first: say so, never end silently
            yield _sse({**head, "choices": [self._choice(chat, "", [], "abort", first)]})
            yield _sse(APIError(str(e), status=503, type="server_error").body())
            yield b"data: [DONE]\n\n"
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
            return error_response(APIError(str(e), status=503, type="server_error"))
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
            raw = await request.body()
            big = len(raw) > OFFLOAD_BYTES
            args = (raw, cls, self.max_model_len, self.max_prompt_chars())
            body = await self.parsers.run(parse_checked, *args) if big else parse_checked(*args)
            stream, _ = await self.submit(body, field, big)
        except APIError as e:
            return error_response(e)
        if body.stream:
            return StreamingResponse(self.stream_response(stream, body, chat), media_type="text/event-stream")
        return await self.full_response(stream, body, chat, request)


def create_app(engine, model_name: str, max_waiting: int = 1024, config: ServerConfig | None = None,
               aliases: tuple[str, ...] = ()) -> FastAPI:
    """The app over ``engine`` (an ``EngineSpec``: the engine process is started now; or an ``LLMEngine``,
    whose loop runs in a thread), served as ``model_name`` (requests may also name one of ``aliases``), with the
    HTTP limits, auth and CORS of ``config``."""
    config = config or ServerConfig()
    server = Server(engine, model_name, max_waiting, aliases)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await server.loop.start()
        freeze_startup_heap()
        yield
        await server.loop.stop()
        unfreeze_heap()
        server.parsers.shutdown()

    app = FastAPI(title="splitfuse", lifespan=lifespan, **fastapi_options(config))
    app.state.server = server
    install_guards(app, config)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.handle(request, CompletionRequest, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.handle(request, ChatRequest, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "splitfuse", "root": model_name,
            "max_model_len": server.max_model_len, "vocab_size": server.vocab_size}]}

    @app.get("/health")
    async def health():
        if server.loop.error is not None:
            return JSONResponse({"status": "error", "error": "the engine failed"}, status_code=503)
        if server.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok", **server.loop.stats()}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.loop.metrics.render(), media_type=CONTENT_TYPE)

    return app
