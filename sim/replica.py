"""A simulated replica: the engine's own scheduler (and its block manager), driven by a SimPy clock.

Per pass: ``plan = scheduler.schedule(now)``; wait the cost model's latency of that plan (times a noise factor
drawn from the profile's measured spread); ``scheduler.update(plan, None, now)``. An idle replica waits for
an arrival event. Where the cost model prices greedy passes (``greedy_seconds``), the replica runs the
engine's ``pipeline_decodes`` too: after a decode-graph pass whose entries all take their argmax it enqueues the
next decode pass ahead (``Scheduler.next_decode_plan``); a plan that is that pass or a subset of it
(``DecodeAhead.rows_for``) takes that pass's time, and any other plan runs after it (the engine discards it once
the GPU ran it). The replica sums its passes' decode context and prompt attention (with its token histogram and
pass count, what a profile's linear energy model needs: ``sim.cluster`` turns them into joules).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import simpy

from engine.policy import DecodeAhead, PassFeatures, PolicyConfig, Request, make_scheduler, plan_features
from sim.costs import CostModel

KV_SERIES_POINTS = 4096  # the KV-use series is thinned by 2 whenever it reaches twice this size
NOISE_BLOCK = 4096  # noise factors drawn per numpy call


class Replica:
    """One engine replica. Its scheduler takes the policy of ``policy`` and the KV geometry of ``cost`` (the
    block size and block count the engine gets on the profiled card)."""

    def __init__(self, env: simpy.Environment, index: int, cost: CostModel, policy: PolicyConfig,
                 noise: bool = True, seed: int = 0, on_finish=None, on_pass=None,
                 router_delivery: Callable[[], float] | None = None) -> None:
        self.env = env
        self.index = index
        self.cost = cost
        self.scheduler = make_scheduler(dataclasses.replace(policy, block_size=cost.block_size),
                                        cost.num_kv_blocks, cost.max_model_len)
        self.noise = noise
        self.rng = np.random.default_rng([seed, index, 0xC057])
        self.on_finish = on_finish
        self.on_pass = on_pass  # (replica index, plan, start, end, delivered) after each pass, before it is applied
        self.router_delivery = router_delivery  # seconds of the fleet router's hop on a token's way out, now
        self.outstanding_requests = 0
        self.outstanding_tokens = 0
        self.unstarted_tokens = 0  # prompt tokens of the requests sent here that have no token yet
        self.num_requests = 0
        self.busy_time = 0.0
        self.decode_context = 0  # summed over passes
        self.prefill_attention = 0
        self.tokens_per_pass = [0] * (policy.max_num_batched_tokens + 1)
        self.kv_times: list[float] = []
        self.kv_usage: list[float] = []
        self._kv_stride = 1
        self._idle: simpy.Event | None = None
        self.reported_kv_usage = 0.0  # as the balancer last heard it (``PolicyConfig.kv_report_interval``)
        self.reported_outstanding_tokens = 0  # outstanding_tokens then
        self.reported_unstarted_tokens = 0  # unstarted_tokens then
        self.kv_capacity_tokens = self.scheduler.stats().kv_capacity_tokens
        self.pipeline_stats = {"enqueued": 0, "used": 0, "discarded": 0}  # decode passes ahead, as the engine's
        self.process = env.process(self.run())

    @property
    def kv_usage_now(self) -> float:
        return self.scheduler.block_manager.usage

    def submit(self, request: Request) -> None:
        """Queue ``request`` here now (ValueError if it can never fit this replica)."""
        self.scheduler.add(request)
        self.num_requests += 1
        self.outstanding_requests += 1
        self.outstanding_tokens += request.num_prompt_tokens + request.max_tokens
        self.unstarted_tokens += request.num_prompt_tokens
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _noise_factors(self) -> list[float]:
        """The next block of pass-time noise factors, in reverse (``pop`` takes the next)."""
        factors = self.cost.noise_factors(self.rng.random(NOISE_BLOCK))
        factors.reverse()
        return factors

    def run(self):
        # The replica keeps its own clock ``now``. A pass that ends before any other event of the simulation
        # (``env.peek()``) runs without a SimPy timeout: nothing else could happen meanwhile, so the result is the
        # same, and a lone replica skips most of SimPy's per-event work. Before anything that other processes can
        # see (finished requests, going idle) the SimPy clock is brought exactly to ``now``.
        env, sched, predict, delivery = self.env, self.scheduler, self.cost.predict, self.cost.delivery_seconds
        hist, on_finish = self.tokens_per_pass, self.on_finish
        heat = self.cost.new_heat() if hasattr(self.cost, "new_heat") else None  # optional in CostModel
        greedy = getattr(self.cost, "greedy_seconds", None)  # optional in CostModel
        block_size = self.cost.block_size
        ahead: DecodeAhead | None = None  # the decode pass enqueued ahead; its seconds, used or discarded
        ahead_seconds = ahead_discarded = 0.0
        factors: list[float] = []
        now = env.now
        while True:
            if not sched.has_unfinished():
                if env.now != now:
                    yield env.timeout(_delay_to(env, now))
                self._idle = env.event()
                yield self._idle
                self._idle = None
                now = env.now
                continue
            plan = sched.schedule(now)
            if plan is None:
                raise RuntimeError(f"replica {self.index}: {sched.num_unfinished} requests wait but none can be "
                                   "scheduled (KV cache or max_num_seqs too small)")
            # the cost model's median, times a noise factor drawn from the profile's measured spread
            features = plan_features(plan)
            seconds = predict(features) if heat is None else predict(features, heat.at(now))
            if seconds < 0:
                raise ValueError(negative_pass_message(self.index, seconds, features))
            step = None  # what a greedy graph pass takes on its own
            if greedy is not None and all(r.takes_argmax for r in plan.requests):
                step = greedy(features, "step", seconds)
            if step is not None:
                seconds = step
            rows, full_ahead = None, False
            if ahead is not None:
                rows = ahead.rows_for(plan, block_size)
                if rows is not None:  # it ran ahead: its GPU work, behind the pass before
                    seconds, full_ahead = ahead_seconds, len(rows) == ahead.plan.num_seqs
                    self.pipeline_stats["used"] += 1
                else:  # the GPU runs it, discarded, before this pass
                    seconds += ahead_discarded
                    self.pipeline_stats["discarded"] += 1
                ahead = None
            if step is not None and (full_ahead or rows is None):
                ahead_plan = sched.next_decode_plan(plan)  # before the update, as the engine asks
                if ahead_plan is not None:
                    self.pipeline_stats["enqueued"] += 1
                    ahead = DecodeAhead.of(ahead_plan, block_size)
                    ahead_features = plan_features(ahead_plan)
                    price = predict(ahead_features) if heat is None else predict(ahead_features, heat.at(now))
                    ahead_seconds = greedy(ahead_features, "ahead", price)
                    ahead_discarded = greedy(ahead_features, "discarded", price)
            if self.noise:
                factors = factors or self._noise_factors()
                seconds *= factors.pop()
            if heat is not None:
                heat.add(now, now + seconds, features.prefill_tokens)
            self.busy_time += seconds
            self.decode_context += features.decode_context
            self.prefill_attention += features.prefill_attention
            hist[features.num_tokens] += 1
            end = now + seconds  # what SimPy's clock would read after ``timeout(seconds)`` at ``now``
            if not end < env.peek():
                yield env.timeout(_delay_to(env, end))
            # tokens are the client's a delivery after their pass ends (the serving path, and a fleet's router)
            delivered = end + delivery(features.num_samples)
            if self.router_delivery is not None:
                delivered += self.router_delivery()
            if self.on_pass is not None:
                self.on_pass(self.index, plan, now, end, delivered)
            now = end
            finished = sched.update(plan, None, delivered)
            for i in range(plan.num_decodes, len(plan.requests)):  # a prompt's end samples the request's first token
                if plan.samples[i] and plan.requests[i].num_output_tokens == 1:
                    self.unstarted_tokens -= plan.requests[i].num_prompt_tokens
            if sched.num_passes % self._kv_stride == 0:
                self._record_kv(now)
            if finished:
                if env.now != now:
                    yield env.timeout(_delay_to(env, now))
                for request in finished:
                    self.outstanding_requests -= 1
                    self.outstanding_tokens -= request.num_prompt_tokens + request.max_tokens
                    on_finish(request, self)

    def _record_kv(self, now: float) -> None:
        """KV use now (every ``_kv_stride``-th pass); the series is thinned by 2 whenever it grows too long."""
        self.kv_times.append(now)
        self.kv_usage.append(self.scheduler.block_manager.usage)
        if len(self.kv_times) >= 2 * KV_SERIES_POINTS:
            del self.kv_times[1::2], self.kv_usage[1::2]
            self._kv_stride *= 2

    def stats(self) -> dict:
        """What a result keeps of the replica (plain data, so that it can come back from a worker process)."""
        s = self.scheduler.stats()
        return {"index": self.index, "requests": self.num_requests, "passes": s.num_passes,
                "busy_time": self.busy_time, "preemptions": s.num_preemptions,
                "decode_context": self.decode_context, "prefill_attention": self.prefill_attention,
                "tokens_per_pass": self.tokens_per_pass, "kv_times": self.kv_times, "kv_usage": self.kv_usage,
                "kv_blocks": s.num_blocks, "pipeline": dict(self.pipeline_stats)}


def negative_pass_message(replica: int, seconds: float, f: PassFeatures) -> str:
    """Why a simulation stops where its cost model prices a pass below zero: a fit taken past the passes it saw."""
    return (f"replica {replica}: the cost model prices a pass of {f.num_tokens} tokens ({f.prefill_tokens} of "
            f"{f.prefill_seqs} prompts, {f.decode_tokens} decodes) at {seconds:.3g} s; a profile's fit goes negative "
            "outside the passes it was swept on: sweep passes like this one (calibration.plans) and fit again")


def _delay_to(env: simpy.Environment, t: float) -> float:
    """The delay that brings SimPy's clock (``env.now + delay``, as SimPy adds it) exactly to ``t``."""
    now = env.now
    delay = t - now
    while now + delay < t:
        delay = math.nextafter(delay, math.inf)
    while now + delay > t:
        delay = math.nextafter(delay, -math.inf)
    return delay
