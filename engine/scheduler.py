"""Batch schedulers: decide what the next forward pass carries, as a ``BatchPlan``.

All schedulers share FCFS admission, a ``max_num_seqs`` bound and preemption by recompute when KV blocks run
out (the victim is the most recently arrived running request not yet in the pass). They differ in how they
mix prompts and decodes:

- ``splitfuse`` (DeepSpeed-FastGen Dynamic SplitFuse): running decodes first, then prompt chunks, so a pass
  carries exactly ``token_budget`` tokens whenever work is waiting; long prompts span several passes.
- ``prefill-first`` (vLLM without chunked prefill): whole prompts in passes of their own, else decodes.
- ``decode-first`` (Orca-style iteration-level batching): decodes, then whole prompts that fit the budget.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.request import Request, RequestState


@dataclass(slots=True)
class BatchPlan:
    """One forward pass. Entry i feeds tokens [start_positions[i], start_positions[i] + num_new_tokens[i]) of
    ``requests[i]``; the first ``num_decodes`` entries are decodes (one token each)."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    start_positions: list[int] = field(default_factory=list)
    samples: list[bool] = field(default_factory=list)
    num_decodes: int = 0
    num_prefill_tokens: int = 0
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + self.num_prefill_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.requests)

    def add(self, request: Request, num_tokens: int, decode: bool) -> None:
        start = request.num_computed_tokens
        self.requests.append(request)
        self.num_new_tokens.append(num_tokens)
        self.start_positions.append(start)
        self.samples.append(start + num_tokens == request.num_tokens)
        if decode:
            self.num_decodes += 1
        else:
            self.num_prefill_tokens += num_tokens

    def features(self) -> dict[str, float]:
        """What a cost model needs to know about this pass."""
        d = self.num_decodes
        decode_context = sum(self.start_positions[:d]) + d
        prefill_attention = sum(n * (s + n) for s, n in zip(self.start_positions[d:], self.num_new_tokens[d:]))
        return {
            "num_tokens": self.num_tokens,
            "prefill_tokens": self.num_prefill_tokens,
            "decode_tokens": d,
            "num_seqs": len(self.requests),
            "prefill_seqs": len(self.requests) - d,
            "decode_context": decode_context,
            "prefill_attention": prefill_attention,
        }


class Scheduler:
    """Shared machinery; subclasses implement ``schedule``."""

    name = "base"
    # Whether a plan's running decodes take their KV blocks before anything else does (the engine then may give a
    # decode its next block a step early: ``LLMEngine(pipeline_decodes=True)``).
    decodes_first = False

    def __init__(self, block_manager: BlockManager, token_budget: int = 768, max_num_seqs: int = 256,
                 max_model_len: int | None = None) -> None:
        if token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.block_manager = block_manager
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in arrival order
        self.num_preemptions = 0

    # -- requests in and out -------------------------------------------------------------------------------
    def check(self, request: Request) -> None:
        """Raise ValueError if ``request`` could never run to completion on this replica."""
        prompt = request.num_prompt_tokens
        total = prompt + request.max_tokens
        if self.max_model_len is not None:
            if prompt >= self.max_model_len:
                raise ValueError(f"request {request.request_id!r}: prompt has {prompt} tokens but the model's "
                                 f"context is {self.max_model_len} (prompt + at least one new token must fit)")
            total = min(total, self.max_model_len)
        bm = self.block_manager
        if bm.blocks_for(total) > bm.num_blocks:
            raise ValueError(f"request {request.request_id!r}: prompt ({prompt}) plus output (up to "
                             f"{total - prompt}) tokens need {bm.blocks_for(total)} KV blocks but the cache holds "
                             f"only {bm.num_blocks} blocks of {bm.block_size} tokens")

    def add(self, request: Request) -> None:
        self.check(request)
        request.state = RequestState.WAITING
        self.waiting.append(request)

    def abort(self, request_id) -> Request | None:
        """Drop a request wherever it is and free its blocks; returns it, or None if unknown."""
        for queue in (self.running, self.waiting):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self.block_manager.free(request)
                    request.state = RequestState.FINISHED
                    request.finish_reason = "abort"
                    return request
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- building a pass -----------------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> BatchPlan | None:
        raise NotImplementedError

    def _make_room(self, plan: BatchPlan, request: Request, num_tokens: int) -> bool:
        """Allocate for ``request``, preempting the newest running requests not in ``plan`` until it fits.

        Returns False if ``request`` itself had to be preempted."""
        bm = self.block_manager
        if bm.allocate(request, num_tokens):
            return True
        in_plan = {id(r) for r in plan.requests}  # built only when blocks run short
        while True:
            victim = next(r for r in reversed(self.running) if id(r) not in in_plan)
            self._preempt(victim, plan)
            if victim is request:
                return False
            if bm.allocate(request, num_tokens):
                return True

    def _preempt(self, request: Request, plan: BatchPlan) -> None:
        self.running.remove(request)
        self.block_manager.register_computed(request, preempting=True)
        self.block_manager.free(request)
        request.state = RequestState.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        plan.preempted.append(request)

    def _schedule_decodes(self, plan: BatchPlan, budget: int, others: list | None = None) -> int:
        """Give every running decode one token (in arrival order) while budget lasts; returns budget left.

        ``others`` (if given) receives the running requests that are not decodes, in arrival order."""
        # The hot loop of the simulator: BatchPlan.add and num_pending_tokens are inlined here, and the columns
        # that are the same for every decode (one new token, always sampled) are filled once after the loop.
        bs = self.block_manager.block_size
        running = RequestState.RUNNING
        requests, starts = plan.requests, plan.start_positions
        add_request, add_start = requests.append, starts.append
        first = len(requests)
        queue = self.running[:]  # a copy: preemption edits self.running
        if len(queue) <= budget:
            # Budget for every running request: it cannot run out, so the loop below without the check.
            for request in queue:
                computed = request.num_computed_tokens
                output = request.num_output_tokens
                if output and request.num_prompt_tokens + output - computed == 1 and request.state is running:
                    if computed < len(request.block_table) * bs or self._make_room(plan, request, 1):
                        add_request(request)
                        add_start(computed)
                elif others is not None:
                    others.append(request)
            budget -= len(requests) - first
            queue = ()
        for request in queue:
            if not budget:
                break
            computed = request.num_computed_tokens
            output = request.num_output_tokens
            if output and request.num_prompt_tokens + output - computed == 1 and request.state is running:
                # Fast path: a decode needs a new block only when its last block is full.
                if computed < len(request.block_table) * bs or self._make_room(plan, request, 1):
                    add_request(request)
                    add_start(computed)
                    budget -= 1
            elif others is not None:
                others.append(request)
        num_decodes = len(requests) - first
        if num_decodes:
            plan.num_new_tokens += [1] * num_decodes
            plan.samples += [True] * num_decodes  # a decode's one token is always the last pending one
            plan.num_decodes += num_decodes
        return budget

    def _admit(self, request: Request, now: float) -> None:
        self.waiting.popleft()
        request.state = RequestState.RUNNING
        if request.scheduled_time is None:
            request.scheduled_time = now
        keys = [r.arrival_time for r in self.running]
        self.running.insert(bisect.bisect_right(keys, request.arrival_time), request)

    def _try_admit_whole(self, plan: BatchPlan, budget: int, now: float) -> int:
        """Admit waiting requests FCFS whose whole pending sequence fits the budget and the cache."""
        bm = self.block_manager
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            bm.match_prefix(request)
            n = request.num_pending_tokens
            if n > budget or not bm.allocate(request, n):
                bm.free(request)
                break
            self._admit(request, now)
            plan.add(request, n, decode=False)
            budget -= n
        return budget

    # -- after the pass ------------------------------------------------------------------------------------
    def update(self, plan: BatchPlan, sampled_token_ids=None, now: float = 0.0) -> list[Request]:
        """Apply a finished pass: advance computed tokens, record sampled tokens, finish and free requests.

        ``sampled_token_ids`` has one id per entry with ``samples`` set, in plan order (None in the simulator).
        """
        bm = self.block_manager
        running = RequestState.RUNNING
        requests, starts, new_tokens, samples = plan.requests, plan.start_positions, plan.num_new_tokens, plan.samples
        finished: list[Request] = []
        first = 0
        if sampled_token_ids is None:
            # The simulator's hot loop: the leading decodes with ``append_token(None, now)`` inlined. A decode
            # has sampled before (so its first token time is set) and starts past its prompt (nothing to
            # register for prefix caching).
            first = d = plan.num_decodes
            for request, start in zip(requests[:d], starts[:d]) if d < len(requests) else zip(requests, starts):
                if request.state is not running:  # aborted while the pass ran
                    continue
                request.num_computed_tokens = start + 1
                n = request.num_output_tokens = request.num_output_tokens + 1
                request.last_token_time = now
                times = request.token_times
                if times is not None:
                    times.append(now)
                if n < request.max_tokens and (request.max_model_len is None
                                               or request.num_prompt_tokens + n < request.max_model_len):
                    continue
                request.finish_reason = "length"
                self._finish(request, now, finished)
            if first == len(requests):
                return finished
        caching = bm.enable_prefix_caching
        tokens = iter(sampled_token_ids) if sampled_token_ids is not None else None
        for i in range(first, len(requests)):
            request, start = requests[i], starts[i]
            sample = samples[i]
            token = next(tokens) if (sample and tokens is not None) else None
            if request.state is not running:  # aborted while the pass ran
                continue
            request.num_computed_tokens = start + new_tokens[i]
            if caching and start < request.num_prompt_tokens:
                bm.register_computed(request)
            if sample and request.append_token(token, now):
                self._finish(request, now, finished)
        return finished

    def _finish(self, request: Request, now: float, finished: list[Request]) -> None:
        request.state = RequestState.FINISHED
        request.finish_time = now
        self.block_manager.free(request)
        self.running.remove(request)
        finished.append(request)


class SplitFuseScheduler(Scheduler):
    """Dynamic SplitFuse: decodes first, then prompt chunks filling the pass to exactly the token budget."""

    name = "splitfuse"
    decodes_first = True

    def schedule(self, now: float = 0.0) -> BatchPlan | None:
        plan = BatchPlan()
        others: list[Request] = []
        budget = self._schedule_decodes(plan, self.token_budget, others)
        # Continue prompts already under way (arrival order), then admit new ones. When budget is left, every
        # running decode is in the plan or preempted, so only ``others`` can still be scheduled.
        for request in others:
            if budget == 0:
                break
            if request.state is not RequestState.RUNNING:
                continue
            n = min(request.num_pending_tokens, budget)
            if self._make_room(plan, request, n):
                plan.add(request, n, decode=False)
                budget -= n
        bm = self.block_manager
        while budget > 0 and not plan.preempted and self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            bm.match_prefix(request)
            n = min(request.num_pending_tokens, budget)
            if not bm.allocate(request, n):
                bm.free(request)
                break
            self._admit(request, now)
            plan.add(request, n, decode=False)
            budget -= n
        return plan if plan.requests else None


class PrefillFirstScheduler(Scheduler):
    """Whole prompts in passes of their own whenever some can be admitted; otherwise one decode pass."""

    name = "prefill-first"

    def check(self, request: Request) -> None:
        super().check(request)
        longest = request.num_prompt_tokens + request.max_tokens - 1  # a recompute after preemption
        if longest > self.token_budget:
            raise ValueError(f"request {request.request_id!r}: {self.name} runs whole prompts, so token_budget "
                             f"({self.token_budget}) must cover prompt + output - 1 = {longest} tokens")

    def schedule(self, now: float = 0.0) -> BatchPlan | None:
        plan = BatchPlan()
        if self.waiting:
            self._try_admit_whole(plan, self.token_budget, now)
        if not plan.requests:
            self._schedule_decodes(plan, self.token_budget)
        return plan if plan.requests else None


class DecodeFirstScheduler(PrefillFirstScheduler):
    """Orca-style: every running decode, then whole prompts that fit the rest of the budget."""

    name = "decode-first"
    decodes_first = True

    def schedule(self, now: float = 0.0) -> BatchPlan | None:
        plan = BatchPlan()
        budget = self._schedule_decodes(plan, self.token_budget)
        if not plan.preempted:
            self._try_admit_whole(plan, budget, now)
        return plan if plan.requests else None


SCHEDULERS = {cls.name: cls for cls in (SplitFuseScheduler, PrefillFirstScheduler, DecodeFirstScheduler)}


def make_scheduler(name: str, block_manager: BlockManager, token_budget: int = 768, max_num_seqs: int = 256,
                   max_model_len: int | None = None) -> Scheduler:
    """Build a scheduler by name: one of ``SCHEDULERS``."""
    try:
        cls = SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {sorted(SCHEDULERS)}") from None
    return cls(block_manager, token_budget=token_budget, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
