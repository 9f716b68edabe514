"""Batch schedulers: decide what the next forward pass carries, as a ``BatchPlan``.

All schedulers share FCFS admission, a ``max_num_seqs`` bound and preemption by recompute when KV blocks run
out (the victim is the most recently arrived running request not yet in the pass). They differ in how they
mix prompts and decodes:

- ``splitfuse`` (DeepSpeed-FastGen Dynamic SplitFuse): running decodes first, then prompt chunks, so a pass
  carries exactly ``token_budget`` tokens whenever work is waiting; long prompts span several passes.
- ``prefill-first`` (vLLM without chunked prefill): whole prompts in passes of their own, else decodes.
- ``decode-first`` (Orca-style iteration-level batching): decodes, then whole prompts that fit the budget.

A scheduler owns its ``BlockManager``: every KV block a request holds was taken through the scheduler.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.policy.block_manager import BlockManager
from engine.policy.config import PolicyConfig
from engine.policy.plan import BatchPlan
from engine.policy.request import Request, RequestState, record_tokens

RUNNING = RequestState.RUNNING


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot of a scheduler for observers (servers, dashboards, the simulator's statistics)."""

    num_running: int
    num_waiting: int
    num_preemptions: int  # since the scheduler was made
    num_passes: int  # plans ``schedule`` returned
    num_blocks: int
    num_free_blocks: int
    block_size: int
    num_computed_tokens: int = 0  # tokens of the running requests whose KV is in the cache

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


class Scheduler:
    """Shared machinery; subclasses implement ``_schedule``."""

    name = "base"
    # Whether a plan's running decodes take their KV blocks before anything else does: then the decode pass that
    # follows a decode pass can be planned before the first one ends (``next_decode_plan``).
    decodes_first = False
    # Whether a pass may hold prompt tokens beside decodes (prefill-first runs them in passes of their own).
    mixes_prompts_and_decodes = True

    def __init__(self, config: PolicyConfig, num_kv_blocks: int, max_model_len: int | None = None) -> None:
        self.config = config
        self.block_manager = BlockManager(num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.token_budget = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in arrival order
        self.num_preemptions = 0
        self.num_passes = 0
        self._observers: list[Callable[[BatchPlan], None]] = []

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

    def add_running(self, request: Request, num_computed_tokens: int, sampled_token: int | None = None) -> None:
        """Put ``request`` straight into the running batch with its first ``num_computed_tokens`` tokens computed
        (their KV blocks taken, contents left as they are) and, with ``sampled_token``, that token sampled after
        them (the request is then a decode): a pass of a chosen shape, for calibration and tests. Raises
        RuntimeError if the blocks are not free."""
        self.check(request)
        if num_computed_tokens and not self.block_manager.allocate(request, num_computed_tokens):
            raise RuntimeError(f"request {request.request_id!r}: not enough free KV blocks for "
                               f"{num_computed_tokens} computed tokens")
        request.num_computed_tokens = num_computed_tokens
        request.state = RUNNING
        self._insert_running(request)
        if sampled_token is not None:
            record_tokens((request,), (num_computed_tokens - 1,), (sampled_token,), 0.0)

    def abort(self, request_id, reason: str = "abort", now: float | None = None) -> Request | None:
        """Drop a request wherever it is and free its blocks; returns it, or None if unknown. ``reason`` becomes its
        ``finish_reason`` ("stop" when the engine found a stop string in its text), ``now`` its ``finish_time``."""
        for queue in (self.running, self.waiting):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self.block_manager.free(request)
                    request.state = RequestState.FINISHED
                    request.finish_reason = reason
                    request.finish_time = now
                    return request
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- what observers see --------------------------------------------------------------------------------
    def observe(self, callback: Callable[[BatchPlan], None]) -> None:
        """Call ``callback(plan)`` with every plan ``schedule`` returns, before anyone runs it."""
        self._observers.append(callback)

    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(len(self.running), len(self.waiting), self.num_preemptions, self.num_passes,
                              bm.num_blocks, bm.num_free_blocks, bm.block_size,
                              sum(r.num_computed_tokens for r in self.running))

    # -- building a pass -----------------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> BatchPlan | None:
        """The next pass, or None when no request can run now."""
        plan = self._schedule(now)
        if plan is None:
            return None
        self.num_passes += 1
        for callback in self._observers:
            callback(plan)
        return plan

    def _schedule(self, now: float) -> BatchPlan | None:
        raise NotImplementedError

    def _make_room(self, request: Request, num_tokens: int, in_pass: list[Request],
                   preempted: list[Request]) -> bool:
        """Allocate for ``request``, preempting the newest running requests not in the pass (``in_pass``) until it
        fits; they are appended to ``preempted``. Returns False if ``request`` itself had to be preempted."""
        bm = self.block_manager
        if bm.allocate(request, num_tokens):
            return True
        in_pass = {id(r) for r in in_pass}  # built only when blocks run short
        while True:
            victim = next(r for r in reversed(self.running) if id(r) not in in_pass)
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
            if bm.allocate(request, num_tokens):
                return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.block_manager.register_computed(request, preempting=True)
        self.block_manager.free(request)
        request.state = RequestState.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _schedule_decodes(self, budget: int, others: list | None = None) -> BatchPlan:
        """A plan of every running decode (one token each, in arrival order) while the budget lasts.

        ``others`` (if given) receives the running requests that are not decodes, in arrival order, up to where
        the budget ran out."""
        block_size = self.block_manager.block_size
        decodes: list[Request] = []
        positions: list[int] = []
        preempted: list[Request] = []
        queue = self.running[:]  # a copy: preemption edits self.running
        may_run_out = len(queue) > budget  # else every decode fits: one token each
        for request in queue:
            computed = request.num_computed_tokens
            output = request.num_output_tokens
            # A decode has sampled and has only that last token pending (prompt + output - computed), and is
            # still running (not preempted to make room for an earlier decode).
            if output and request.num_prompt_tokens + output - computed == 1 and request.state is RUNNING:
                if may_run_out and len(decodes) == budget:
                    break
                # It needs a new block only when its last block is full.
                if (computed < len(request.block_table) * block_size
                        or self._make_room(request, 1, decodes, preempted)):
                    decodes.append(request)
                    positions.append(computed)
            elif others is not None:
                others.append(request)
        return BatchPlan.of_decodes(decodes, positions, preempted)

    def _admit(self, request: Request, now: float) -> None:
        self.waiting.popleft()
        request.state = RUNNING
        if request.scheduled_time is None:
            request.scheduled_time = now
        self._insert_running(request)

    def _insert_running(self, request: Request) -> None:
        keys = [r.arrival_time for r in self.running]
        self.running.insert(bisect.bisect_right(keys, request.arrival_time), request)

    def _admit_whole(self, plan: BatchPlan, budget: int, now: float) -> int:
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
            plan.add_chunk(request, n)
            budget -= n
        return budget

    # -- after the pass ------------------------------------------------------------------------------------
    def update(self, plan: BatchPlan, sampled_token_ids=None, now: float = 0.0) -> list[Request]:
        """Apply a finished pass: advance computed tokens, record sampled tokens, finish and free requests.

        ``sampled_token_ids`` has one id per entry with ``samples`` set, in plan order (None in the simulator,
        which samples no tokens). Requests aborted while the pass ran are left as they are.
        """
        d, requests, tokens = plan.num_decodes, plan.requests, sampled_token_ids
        # Decodes: one token each, always sampled. (Many passes hold nothing else: then nothing is sliced.)
        if d == len(requests):
            finished = record_tokens(requests, plan.start_positions, tokens, now)
        else:
            finished = record_tokens(requests[:d], plan.start_positions[:d], None if tokens is None else tokens[:d],
                                     now)
        for request in finished:
            self._finish(request, now)
        if d < len(requests):
            finished += self._update_chunks(plan, None if tokens is None else tokens[d:], now)
        return finished

    def _update_chunks(self, plan: BatchPlan, sampled_token_ids, now: float) -> list[Request]:
        """The prompt chunks of ``update``: their tokens are computed, their full blocks published for prefix
        caching; the chunk that ends a prompt (or a recompute after preemption) samples."""
        bm, d, finished = self.block_manager, plan.num_decodes, []
        tokens = None if sampled_token_ids is None else iter(sampled_token_ids)
        for request, start, n, sample in zip(plan.requests[d:], plan.start_positions[d:], plan.num_new_tokens[d:],
                                             plan.samples[d:]):
            token = next(tokens) if sample and tokens is not None else None
            if request.state is not RUNNING:
                continue
            request.num_computed_tokens = start + n
            if bm.enable_prefix_caching and start < request.num_prompt_tokens:
                bm.register_computed(request)
            if sample and record_tokens((request,), (start + n - 1,), None if token is None else (token,), now):
                self._finish(request, now)
                finished.append(request)
        return finished

    def _finish(self, request: Request, now: float) -> None:
        request.state = RequestState.FINISHED
        request.finish_time = now
        self.block_manager.free(request)
        self.running.remove(request)

    # -- planning ahead ------------------------------------------------------------------------------------
    def next_decode_plan(self, plan: BatchPlan) -> BatchPlan | None:
        """The plan ``schedule`` will return after the decode-only ``plan`` if nothing else happens meanwhile
        (no arrival, abort or stop token): every request one token further. The KV blocks it needs are taken
        now, as ``schedule`` would take them, so a request whose next token starts a block gets it a pass early.
        None, taking nothing, when that plan cannot be told now: requests wait (they would be admitted), the pass
        preempted, a request finishes by length in it, the scheduler does not put decodes first, or the free
        blocks do not suffice."""
        if (self.waiting or plan.preempted or plan.num_tokens != plan.num_seqs or not all(plan.samples)
                or not plan.requests):
            return None
        bs = self.block_manager.block_size
        crossing = 0
        for request, position in zip(plan.requests, plan.start_positions):
            if request.num_output_tokens + 1 >= request.length_limit:
                return None
            crossing += (position + 1) // bs >= len(request.block_table)
        if crossing and (crossing > self.block_manager.num_free_blocks or not self.decodes_first):
            return None
        for request, position in zip(plan.requests, plan.start_positions):
            if (position + 1) // bs >= len(request.block_table):
                self.block_manager.allocate(request, 2)  # this pass's token and the next one
        n = plan.num_seqs
        return BatchPlan(list(plan.requests), [1] * n, [p + 1 for p in plan.start_positions], [True] * n,
                         num_decodes=n)


class SplitFuseScheduler(Scheduler):
    """Dynamic SplitFuse: decodes first, then prompt chunks filling the pass to exactly the token budget."""

    name = "splitfuse"
    decodes_first = True

    def _schedule(self, now: float) -> BatchPlan | None:
        others: list[Request] = []
        plan = self._schedule_decodes(self.token_budget, others)
        budget = self.token_budget - plan.num_decodes
        # Continue prompts already under way (arrival order), then admit new ones. When budget is left, every
        # running decode is in the plan or preempted, so only ``others`` can still be scheduled.
        for request in others:
            if budget == 0:
                break
            if request.state is not RUNNING:
                continue
            n = min(request.num_pending_tokens, budget)
            if self._make_room(request, n, plan.requests, plan.preempted):
                plan.add_chunk(request, n)
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
            plan.add_chunk(request, n)
            budget -= n
        return plan if plan.requests else None


class PrefillFirstScheduler(Scheduler):
    """Whole prompts in passes of their own whenever some can be admitted; otherwise one decode pass."""

    name = "prefill-first"
    mixes_prompts_and_decodes = False

    def check(self, request: Request) -> None:
        super().check(request)
        longest = request.num_prompt_tokens + request.length_limit - 1  # a recompute after preemption
        if longest > self.token_budget:
            raise ValueError(f"request {request.request_id!r}: {self.name} runs whole prompts, so "
                             f"max_num_batched_tokens ({self.token_budget}) must cover prompt + output - 1 = {longest} "
                             "tokens")

    def _schedule(self, now: float) -> BatchPlan | None:
        plan = BatchPlan()
        if self.waiting:
            self._admit_whole(plan, self.token_budget, now)
        if not plan.requests:
            plan = self._schedule_decodes(self.token_budget)
        return plan if plan.requests else None


class DecodeFirstScheduler(PrefillFirstScheduler):
    """Orca-style: every running decode, then whole prompts that fit the rest of the budget."""

    name = "decode-first"
    decodes_first = True
    mixes_prompts_and_decodes = True

    def _schedule(self, now: float) -> BatchPlan | None:
        plan = self._schedule_decodes(self.token_budget)
        budget = self.token_budget - plan.num_decodes
        if not plan.preempted:
            self._admit_whole(plan, budget, now)
        return plan if plan.requests else None


SCHEDULERS = {cls.name: cls for cls in (SplitFuseScheduler, PrefillFirstScheduler, DecodeFirstScheduler)}


def scheduler_class(name: str) -> type[Scheduler]:
    """The scheduler called ``name``; ValueError naming the choices for an unknown one."""
    if name not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r} (--scheduler); choose one of {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name]


def make_scheduler(config: PolicyConfig, num_kv_blocks: int, max_model_len: int | None = None) -> Scheduler:
    """The scheduler ``config.scheduler`` names, with its own block manager of ``num_kv_blocks`` blocks."""
    return scheduler_class(config.scheduler)(config, num_kv_blocks, max_model_len)
