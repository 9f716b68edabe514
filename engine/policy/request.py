"""A request and its life cycle: waiting -> running (<-> preempted) -> finished."""

from __future__ import annotations

import enum
from array import array
from itertools import repeat

from engine.policy.sampling_params import SamplingParams


class RequestState(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


class Request:
    """One generation request as the scheduler and the block manager see it.

    The real engine passes ``prompt_token_ids``; the simulator, which produces no tokens, passes only
    ``num_prompt_tokens`` and describes a shared prefix by ``prefix_id``/``prefix_len`` (for prefix caching), and
    its sampled tokens are None. ``num_computed_tokens`` counts tokens whose KV is in the cache; the last sampled
    token is not in it yet. ``token_times`` holds when each output token was sampled.
    """

    __slots__ = (
        "request_id", "prompt_token_ids", "num_prompt_tokens", "sampling_params", "max_tokens", "arrival_time",
        "eos_token_id", "max_model_len", "prefix_id", "prefix_len", "state", "output_token_ids",
        "num_output_tokens", "num_computed_tokens", "num_cached_tokens", "num_registered_blocks", "block_table",
        "num_preemptions", "length_limit",
        "scheduled_time", "token_times", "finish_time", "finish_reason",
        "_block_hashes",
    )

    def __init__(self, request_id, prompt_token_ids: list[int] | None = None,
                 sampling_params: SamplingParams | None = None, arrival_time: float = 0.0, *,
                 num_prompt_tokens: int | None = None, eos_token_id: int | None = None,
                 max_model_len: int | None = None, prefix_id=None, prefix_len: int = 0) -> None:
        if prompt_token_ids is not None:
            prompt_token_ids = list(prompt_token_ids)
            num_prompt_tokens = len(prompt_token_ids)
        if not num_prompt_tokens or num_prompt_tokens < 1:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = num_prompt_tokens
        self.sampling_params = sampling_params = sampling_params or SamplingParams()
        self.max_tokens = sampling_params.max_tokens
        self.arrival_time = arrival_time
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        # output tokens at which the request stops by length: max_tokens, or where it reaches the context limit
        self.length_limit = self.max_tokens if max_model_len is None else \
            min(self.max_tokens, max_model_len - num_prompt_tokens)
        self.prefix_id = prefix_id
        self.prefix_len = min(prefix_len, num_prompt_tokens)
        self.state = RequestState.WAITING
        self.output_token_ids: list[int] | None = [] if prompt_token_ids is not None else None
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at the last admission
        self.num_registered_blocks = 0  # leading prompt blocks already published to the prefix cache
        self.block_table: list[int] = []
        self.num_preemptions = 0
        self.scheduled_time: float | None = None
        self.token_times = array("d")
        self.finish_time: float | None = None
        self.finish_reason: str | None = None
        self._block_hashes: list = []

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.state.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}/{self.max_tokens}, computed={self.num_computed_tokens})")

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def last_token_time(self) -> float | None:
        return self.token_times[-1] if self.token_times else None

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to feed before the next token can be sampled (1 for a running decode)."""
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    def banned_token_ids(self) -> list[int]:
        """Tokens it may not sample yet: until ``min_tokens`` are out, its stop tokens and EOS (vLLM's behaviour)."""
        p = self.sampling_params
        if self.num_output_tokens >= p.min_tokens:
            return []
        return list(p.stop_token_ids) + ([self.eos_token_id] if self.eos_token_id is not None else [])

    @property
    def takes_argmax(self) -> bool:
        """Whether its next token is its row's plain argmax (greedy, holding no token back): what a pass's graph
        computes on the device, and the engine then needs no sampling (and may enqueue the next decode ahead)."""
        return self.sampling_params.greedy and not self.banned_token_ids()

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end) without copying the whole sequence."""
        p = self.num_prompt_tokens
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        if end <= p:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    def block_hash(self, index: int, block_size: int):
        """Identity of full prompt block ``index`` for prefix caching (a hash chain)."""
        hashes = self._block_hashes
        while len(hashes) <= index:
            i = len(hashes)
            end = (i + 1) * block_size
            if self.prompt_token_ids is not None:
                parent = hashes[-1] if hashes else None
                hashes.append(hash((parent, tuple(self.prompt_token_ids[i * block_size:end]))))
            elif self.prefix_id is not None and end <= self.prefix_len:
                hashes.append(hash(("prefix", self.prefix_id, i)))
            else:  # the simulator's tokens past a shared prefix are this request's own, as random tokens are
                hashes.append(hash(("own", self.request_id, i)))
        return hashes[index]

    def stops_at(self, token_id: int, num_output_tokens: int) -> bool:
        """Whether sampling ``token_id`` as output token number ``num_output_tokens`` ends the request (a stop
        token or EOS, once ``min_tokens`` are out)."""
        params = self.sampling_params
        return num_output_tokens >= params.min_tokens and (
            token_id in params.stop_token_ids or (token_id == self.eos_token_id and not params.ignore_eos))


def record_tokens(requests, positions, token_ids, now: float) -> list[Request]:
    """Each of ``requests`` sampled one token after computing the one at ``positions``: count that one computed,
    record the new token (``token_ids`` None in the simulator, which samples no tokens) and its time; returns the
    requests that are now done, with their ``finish_reason`` set. Requests no longer running (aborted while their
    pass ran) are skipped. The one place where a request's output and token times grow."""
    done = []
    running = RequestState.RUNNING
    for request, position, token in zip(requests, positions, token_ids if token_ids is not None else repeat(None)):
        if request.state is not running:
            continue
        request.num_computed_tokens = position + 1
        n = request.num_output_tokens = request.num_output_tokens + 1
        request.token_times.append(now)
        if token is not None:
            request.output_token_ids.append(token)
            if n < request.max_tokens and request.stops_at(token, n):
                request.finish_reason = "stop"
                done.append(request)
                continue
        if n >= request.length_limit:
            request.finish_reason = "length"
            done.append(request)
    return done
