"""OpenAI request bodies, their validation, and OpenAI-style error bodies.

Every rejection is an ``APIError`` with the HTTP status and the offending field (``param``), rendered as
``{"error": {"message", "type", "param", "code"}}`` as OpenAI does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.policy import SamplingParams


class APIError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def __reduce__(self):  # whole across processes (the body parser's worker)
        return APIError, (self.message, self.param, self.status, self.type)


MAX_TEMPERATURE = 2.0  # OpenAI's range; beyond it sampling is noise
MAX_STOP = 64  # stop strings (and stop token ids) per request: each is checked at every new token
MAX_STOP_CHARS = 1024
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 64)  # what torch's generator takes
    n: int = 1
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    stream_options: dict | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's extensions
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP)

    # fields accepted only at their default (the engine has no such feature)
    UNSUPPORTED: ClassVar[tuple[str, ...]] = ("n", "presence_penalty", "frequency_penalty", "echo", "logprobs")

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                                  top_k=self.top_k, seed=self.seed, stop_token_ids=self.stop_token_ids or [],
                                  ignore_eos=self.ignore_eos, min_tokens=self.min_tokens)
        except ValueError as e:  # SamplingParams names the field first: "top_k must be ..."
            raise APIError(str(e), param=str(e).split()[0]) from None

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise APIError(f"batched prompts are not supported ({len(p)} given); send one request per prompt",
                               param="prompt")
            p = p[0]
        if not p:
            raise APIError("prompt is empty", param="prompt")
        return p


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise APIError(f"only text content parts are supported, got {part.get('type')!r}",
                               param="messages")
            parts.append(part.get("text", ""))
        return "".join(parts)


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    max_completion_tokens: int | None = Field(None, ge=1)


def _surrogate_path(obj, path: str = "") -> str | None:
    """The JSON path of the first string holding undecodable bytes (decoded with surrogateescape)."""
    if isinstance(obj, str):
        return path if any("\udc80" <= ch <= "\udcff" for ch in obj) else None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        if isinstance(key, str) and _surrogate_path(key) is not None:
            return f"{path}.{key}" if path else key
        sub = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        found = _surrogate_path(value, sub)
        if found is not None:
            return found
    return None


def parse_body(raw: bytes, model_cls: type[_Body]) -> _Body:
    """Decode, parse and validate a request body; ``APIError`` naming the field on any problem."""
    try:
        text, invalid_utf8 = raw.decode("utf-8"), False
    except UnicodeDecodeError:  # decoded again keeping the bad bytes, to name the field that holds them
        text, invalid_utf8 = raw.decode("utf-8", errors="surrogateescape"), True
    try:
        obj = json.loads(text)
    except RecursionError:
        raise APIError("malformed JSON body: nested too deeply", param="body") from None
    except json.JSONDecodeError as e:
        if invalid_utf8:
            raise APIError("request body is not valid UTF-8", param="body") from None
        raise APIError(f"malformed JSON body: {e.msg} at line {e.lineno} column {e.colno}", param="body") from None
    if invalid_utf8:
        try:
            bad = _surrogate_path(obj)
        except RecursionError:
            bad = None
        raise APIError("request body is not valid UTF-8" + (f" (in field {bad!r})" if bad else ""),
                       param=bad or "body")
    if not isinstance(obj, dict):
        raise APIError(f"request body must be a JSON object, got {type(obj).__name__}", param="body")
    try:
        body = model_cls.model_validate(obj)
    except ValidationError as e:
        errors = e.errors()  # of a union's branches, the one that says more than "not this type"
        err = next((x for x in errors if not x["type"].endswith("_type")), errors[0])
        param = _field_path(err["loc"])
        if err["type"] == "missing":
            raise APIError(f"{param} is required", param=param) from None
        raise APIError(f"{param}: {err['msg']} (got {_short(err.get('input'))})", param=param) from None
    for name in model_cls.UNSUPPORTED:
        if name not in model_cls.model_fields:
            continue
        default = model_cls.model_fields[name].default
        if getattr(body, name) not in (default, None):
            raise APIError(f"{name}={getattr(body, name)!r} is not supported (only {default!r})", param=name)
    return body


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _field_path(loc) -> str:
    """'messages[0].role' from pydantic's loc, dropping the names of union branches."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "int", "float", "bool") or "[" in part or "-" in part:
            break
        else:
            out += f".{part}" if out else part
    return out


def check_prompt_size(body: _Body, max_model_len: int, max_chars: int | None) -> None:
    """``APIError`` for a prompt that can never fit the context, found without tokenizing: more token ids than
    ``max_model_len - 1``, or (``max_chars``: what the context can hold at most) more characters of text."""
    field = "messages" if isinstance(body, ChatRequest) else "prompt"
    if isinstance(body, ChatRequest):
        n_chars = sum(len(m.content) if isinstance(m.content, str) else
                      sum(len(str(p.get("text", ""))) for p in m.content) for m in body.messages if m.content)
    else:
        prompt = body.single_prompt()
        if not isinstance(prompt, str):
            if len(prompt) >= max_model_len:
                raise APIError(f"{field} has {len(prompt)} tokens but the model's context is {max_model_len} "
                               f"(prompt + at least one new token must fit)", param=field)
            return
        n_chars = len(prompt)
    if max_chars is not None and n_chars > max_chars:
        raise APIError(f"{field} has {n_chars} characters, more than the model's context of {max_model_len} "
                       f"tokens can hold", param=field)


def parse_checked(raw: bytes, model_cls: type[_Body], max_model_len: int, max_chars: int | None) -> _Body:
    """``parse_body`` and ``check_prompt_size``: what the server's body-parser process runs for a big body, so
    that only bodies whose prompt may fit come back (a 10 MB one never crosses back, nor holds the API
    process's GIL while it is parsed)."""
    body = parse_body(raw, model_cls)
    check_prompt_size(body, max_model_len, max_chars)
    return body
