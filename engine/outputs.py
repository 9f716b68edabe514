"""What the engine returns, in vLLM's shape: a ``RequestOutput`` per request holding one ``CompletionOutput`` per
sample (``n`` of them), and the request's wall-clock ``RequestMetrics``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (``time.monotonic()`` seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One sample of a request (vLLM's ``CompletionOutput``). ``text`` is decoded once the sample finishes (when a
    tokenizer exists; with stop strings it ends before the stop string, which ``stop_reason`` then holds; a stop
    token's id is ``stop_reason`` when it ended the sample). ``finish_reason``: "stop", "length", "abort", or "error"
    (the request's ``error`` says why). ``cumulative_logprob`` is None: the engine does not compute logprobs."""

    index: int
    text: str | None
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request after a step of ``LLMEngine`` or at the end of ``LLM.generate`` (vLLM's ``RequestOutput``).

    ``prompt`` is the prompt's text (None for token-id prompts). ``new_token_ids`` (splitfuse's): the tokens of
    ``outputs[0]`` that came in this step, what a stream sends on. ``error``: why a request that could not run was
    rejected (its output's ``finish_reason`` is "error").
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    new_token_ids: list[int] = field(default_factory=list)
    error: str | None = None
