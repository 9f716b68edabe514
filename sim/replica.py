"""A simulated replica: the engine's own scheduler and block manager, driven by a SimPy clock.

Per pass: ``plan = scheduler.schedule(now)``; wait the cost model's latency of that plan (times a noise factor
drawn from the profile's measured spread); ``scheduler.update(plan, None, now)``. An idle replica waits for
an arrival event.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from engine.block_manager import BlockManager
from engine.request import Request
from engine.scheduler import make_scheduler

KV_SERIES_POINTS = 4096  # the KV-use series is thinned by 2 whenever it reaches twice this size


class BufferedRandom:
    """A numpy Generator whose ``random()`` serves pre-drawn blocks (one numpy call per 4,096 passes, not per
    pass); other methods go to the generator itself."""

    def __init__(self, generator: np.random.Generator, block: int = 4096) -> None:
        self.generator = generator
        self.block = block
        self._values: list[float] = []

    def random(self) -> float:
        if not self._values:
            self._values = self.generator.random(self.block).tolist()
            self._values.reverse()
        return self._values.pop()

    def draw_block(self):
        """The next values ``random()`` would return (what is left of the current block, else a new block), as a
        numpy array, consumed."""
        if self._values:
            values = np.array(self._values[::-1])
            self._values = []
            return values
        return self.generator.random(self.block)

    def __getattr__(self, name):
        return getattr(self.generator, name)


class Replica:
    def __init__(self, env: simpy.Environment, index: int, cost, scheduler: str = "splitfuse",
                 token_budget: int = 768, max_num_seqs: int = 256, prefix_caching: bool = True,
                 noise: bool = True, seed: int = 0, on_finish=None) -> None:
        self.env = env
        self.index = index
        self.cost = cost
        self.block_manager = BlockManager(cost.num_kv_blocks, cost.block_size, prefix_caching)
        self.scheduler = make_scheduler(scheduler, self.block_manager, token_budget=token_budget,
                                        max_num_seqs=max_num_seqs, max_model_len=cost.max_model_len)
        self.noise = noise
        self.rng = BufferedRandom(np.random.default_rng([seed, index, 0xC057]))
        self.on_finish = on_finish
        self.outstanding_requests = 0
        self.outstanding_tokens = 0
        self.num_requests = 0
        self.num_passes = 0
        self.busy_time = 0.0
        self.tokens_per_pass = [0] * (token_budget + 1)
        self.kv_times: list[float] = []
        self.kv_usage: list[float] = []
        self._kv_stride = 1
        self._idle: simpy.Event | None = None
        self.process = env.process(self.run())

    def submit(self, request: Request) -> None:
        """Queue ``request`` here now (ValueError if it can never fit this replica)."""
        self.scheduler.add(request)
        self.num_requests += 1
        self.outstanding_requests += 1
        self.outstanding_tokens += request.num_prompt_tokens + request.max_tokens
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def run(self):
        # The replica keeps its own clock ``now``. A pass that ends before any other event of the simulation
        # (``env.peek()``) runs without a SimPy timeout: nothing else could happen meanwhile, so the result is the
        # same, and a lone replica skips most of SimPy's per-event work. Before anything that other processes can
        # see (finished requests, going idle) the SimPy clock is brought exactly to ``now``.
        env, sched, bm = self.env, self.scheduler, self.block_manager
        schedule, update, predict = sched.schedule, sched.update, self.cost.predict_plan
        sample_factor = self.cost.sample_factor if self.noise else None
        # A cost model with ``noise_factors`` (a profile) maps a whole block of uniforms to factors in one numpy
        # call: the same uniforms in the same order as ``sample_factor(rng)`` per pass, so the same factors.
        noise_factors = getattr(self.cost, "noise_factors", None) if self.noise else None
        factors: list[float] = []
        rng, hist, on_finish = self.rng, self.tokens_per_pass, self.on_finish
        kv_times, kv_usage = self.kv_times, self.kv_usage
        peek, timeout = env.peek, env.timeout
        now = env.now
        while True:
            if not (sched.waiting or sched.running):
                if env.now != now:
                    yield timeout(_delay_to(env, now))
                self._idle = env.event()
                yield self._idle
                self._idle = None
                now = env.now
                continue
            plan = schedule(now)
            if plan is None:
                raise RuntimeError(f"replica {self.index}: {sched.num_unfinished} requests wait but none can be "
                                   "scheduled (KV cache or max_num_seqs too small)")
            latency = predict(plan)
            if noise_factors is not None:
                if not factors:
                    factors = noise_factors(rng.draw_block())
                    factors.reverse()
                latency *= factors.pop()
            elif sample_factor is not None:
                latency *= sample_factor(rng)
            self.busy_time += latency
            hist[plan.num_decodes + plan.num_prefill_tokens] += 1
            end = now + latency  # what SimPy's clock would read after ``timeout(latency)`` at ``now``
            if not end < peek():
                yield timeout(_delay_to(env, end))
            now = end
            finished = update(plan, None, now)
            n = self.num_passes = self.num_passes + 1
            if n % self._kv_stride == 0:
                kv_times.append(now)
                kv_usage.append(bm.usage)
                if len(kv_times) >= 2 * KV_SERIES_POINTS:
                    del kv_times[1::2], kv_usage[1::2]
                    self._kv_stride *= 2
            if finished:
                if env.now != now:
                    yield timeout(_delay_to(env, now))
                for request in finished:
                    self.outstanding_requests -= 1
                    self.outstanding_tokens -= request.num_prompt_tokens + request.max_tokens
                    on_finish(request, self)


def _delay_to(env: simpy.Environment, t: float) -> float:
    """The delay that brings SimPy's clock (``env.now + delay``, as SimPy adds it) exactly to ``t``."""
    now = env.now
    delay = t - now
    while now + delay < t:
        delay = math.nextafter(delay, math.inf)
    while now + delay > t:
        delay = math.nextafter(delay, -math.inf)
    return delay
