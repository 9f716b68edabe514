"""A cluster: N replicas behind a load balancer, fed by a workload; ``simulate`` runs one replication."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from engine.policy import BatchPlan, PolicyConfig, ReplicaLoad, Request, SamplingParams, make_balancer
from engine.policy.load_balancer import estimate_kv_usage
from sim.costs import DEFAULT_PROFILE, CostModel, load_cost_model
from sim.replica import Replica
from sim.request_log import RequestLog
from sim.router import RouterCost
from sim.saturation import with_rate
from sim.workload import RequestTable, Workload


@dataclass
class ClusterConfig:
    """``replicas`` replicas behind one load balancer, each running ``policy`` (its scheduler, token budget,
    ``max_num_seqs``, prefix caching; the balancer) on ``cost``: one cost model for every replica or a list with
    one per replica, each a cost model or what ``--profile`` takes (a shipped profile name or a profile path).
    ``noise``: draw pass times from the profile's measured spread. ``router``: the hop that the router in front of
    more than one replica adds, as ``splitfuse serve --replicas N`` runs one (``sim.router``; None: an ideal
    balancer that costs nothing; a lone replica is served directly)."""

    cost: CostModel | str | Path | list = DEFAULT_PROFILE
    replicas: int = 4
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    noise: bool = True
    router: RouterCost | None = None

    def routed(self) -> RouterCost | None:
        """The router the fleet's requests and tokens pass through, if any."""
        return self.router if self.router is not None and self.replicas > 1 else None

    def __post_init__(self) -> None:
        if isinstance(self.cost, (list, tuple)):
            self.cost = [_cost_model(c) for c in self.cost]
        else:
            self.cost = _cost_model(self.cost)

    def costs(self) -> list[CostModel]:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if isinstance(self.cost, (list, tuple)):
            if len(self.cost) != self.replicas:
                raise ValueError(f"{len(self.cost)} cost models for {self.replicas} replicas")
            return list(self.cost)
        return [self.cost] * self.replicas


def _cost_model(cost) -> CostModel:
    return load_cost_model(str(cost)) if isinstance(cost, (str, Path)) else cost


class SimResult:
    """Everything one replication produced. ``requests`` (one row per request), ``replicas`` and ``kv`` are
    DataFrames, built on first access (pandas is imported only then); ``columns`` holds the requests as numpy
    columns and ``replica_rows`` the replicas as dicts. ``energy_j``: the fleet's energy from the first arrival to
    the last finish (each replica's ``energy_j``; NaN where a replica's cost model has no energy figures)."""

    def __init__(self, columns: dict, replica_rows: list[dict], kv_parts: list[tuple], tokens_per_pass: np.ndarray,
                 log: RequestLog, config: ClusterConfig, seed: int, meta: dict | None = None) -> None:
        self.columns = columns
        self.replica_rows = replica_rows
        self.tokens_per_pass = tokens_per_pass  # [replica, tokens] -> passes
        self.log = log
        self.config = config
        self.seed = seed
        self.meta = meta or {}
        self._kv_parts = kv_parts  # (replica, times, usages) per replica
        self._frames: dict = {}

    @property
    def energy_j(self) -> float:
        return float(sum(r["energy_j"] for r in self.replica_rows))

    @property
    def requests(self):
        if "requests" not in self._frames:
            import pandas as pd

            self._frames["requests"] = pd.DataFrame(self.columns)
        return self._frames["requests"]

    @property
    def replicas(self):
        if "replicas" not in self._frames:
            import pandas as pd

            self._frames["replicas"] = pd.DataFrame(self.replica_rows)
        return self._frames["replicas"]

    @property
    def token_times(self):
        """One row per output token (request id, token index, time in s), if the run kept them."""
        if "token_times" not in self._frames:
            self._frames["token_times"] = self.log.token_times_frame()
        return self._frames["token_times"]

    @property
    def kv(self):
        if "kv" not in self._frames:
            import pandas as pd

            parts = self._kv_parts
            self._frames["kv"] = pd.DataFrame({
                "replica": np.repeat([i for i, _, _ in parts], [len(t) for _, t, _ in parts]),
                "time": np.concatenate([t for _, t, _ in parts]),
                "kv_usage": np.concatenate([u for _, _, u in parts])})
        return self._frames["kv"]


class _Loads(Sequence):
    """A lazy view of the replicas' loads: a balancer pays only for the replicas it looks at, and for the KV usage
    estimate only if it decides by it (``reads_kv_usage``)."""

    __slots__ = ("replicas", "reads_kv_usage")

    def __init__(self, replicas: list[Replica], reads_kv_usage: bool) -> None:
        self.replicas, self.reads_kv_usage = replicas, reads_kv_usage

    def __len__(self) -> int:
        return len(self.replicas)

    def __getitem__(self, i: int) -> ReplicaLoad:
        r = self.replicas[i]
        kv = estimate_kv_usage(r.reported_kv_usage, r.outstanding_tokens, r.reported_outstanding_tokens,
                               r.kv_capacity_tokens, r.reported_unstarted_tokens) \
            if self.reads_kv_usage else r.reported_kv_usage
        return ReplicaLoad(r.outstanding_requests, r.outstanding_tokens, kv)


def check_fits(table: RequestTable, costs: list, config: ClusterConfig) -> None:
    """Reject, before simulating, a request that no replica could ever hold (naming its row)."""
    prompts, outputs = table.prompt_tokens, table.output_tokens
    first_index = {id(cost): i for i, cost in reversed(list(enumerate(costs)))}
    for i in sorted(first_index.values()):  # each distinct cost model once
        cost = costs[i]
        limit = cost.max_model_len
        total = prompts + outputs if limit is None else np.minimum(prompts + outputs, limit)
        need = -(-total // cost.block_size)
        bad = np.flatnonzero((need > cost.num_kv_blocks) | ((prompts >= limit) if limit else False))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"{table.name(j)} (prompt {int(prompts[j])}, output {int(outputs[j])} tokens) can never "
                             f"run on replica {i}: its KV cache holds {cost.num_kv_blocks} blocks of "
                             f"{cost.block_size} tokens, context limit {limit}")
        policy = config.policy
        if policy.scheduler != "splitfuse":
            longest = total - 1  # a recompute after preemption; the output stops at the context limit
            j = int(np.argmax(longest))
            if longest[j] > policy.max_num_batched_tokens:
                raise ValueError(f"--max-num-batched-tokens {policy.max_num_batched_tokens} is too small for "
                                 f"{policy.scheduler}: "
                                 f"{table.name(j)} needs whole passes of up to {int(longest[j])} tokens")


def admission_delays(table: RequestTable, costs: list, seed: int, router: RouterCost | None = None) -> list[float]:
    """Each request's admission, from the client's send until its replica's engine has it (drawn, seeded, from
    the first replica's cost model: the serving stack in front of the replicas), and through ``router``."""
    uniforms = np.random.default_rng([seed, 0xAD]).random(len(table))
    delays = np.asarray(costs[0].admission_seconds(table.prompt_tokens, uniforms), dtype=float)
    return (delays + (router.admission_s if router is not None else 0.0)).tolist()


def arrival_order(table: RequestTable, admission: list[float]) -> list[tuple[int, float, float]]:
    """(request, time it reaches its replica, time the client sent it) in the order requests reach replicas:
    ``admission`` seconds (one per request) after their arrival."""
    sent = table.arrivals
    if not any(admission):
        return [(i, t, t) for i, t in enumerate(sent.tolist())]
    reach = sent + np.asarray(admission)
    order = np.argsort(reach, kind="stable")
    return list(zip(order.tolist(), reach[order].tolist(), sent[order].tolist()))


# Balancers whose choice depends only on the order of arrivals, never on replica state: with these, each replica
# is an independent simulation, and replicas can run in separate processes with exactly the same results.
STATE_FREE_BALANCERS = ("round-robin", "random")
PARALLEL_MIN_REQUESTS = 20_000  # below this, starting worker processes costs more than it saves


def simulate(workload: Workload | RequestTable, config: ClusterConfig, seed: int = 0, warmup: float = 0.0,
             cooldown: float = 0.0, progress: bool = False, workers: int | None = None,
             on_pass: Callable[[int, BatchPlan, float, float, float], None] | None = None,
             token_times: bool = False, workload_seed: int | None = None,
             routes: Sequence[int] | None = None) -> SimResult:
    """Run one replication. ``warmup``/``cooldown``: shares of the requests (by arrival order) left out of
    the statistics. An open-loop workload without a rate runs at its ``load`` x the estimated capacity
    (``sim.saturation.with_rate``); ``result.meta["workload"]`` is the workload as run. ``token_times``: keep
    every token's time (``result.token_times``). ``workload_seed`` (default ``seed``) generates the workload's
    requests, ``seed`` everything the simulation draws (pass-time noise, serving delays, balancer choices).

    ``workers``: processes to spread the replicas over (None: one per CPU for big open-loop runs). Only with a
    balancer in ``STATE_FREE_BALANCERS``, open-loop arrivals and no router whose hop grows with its streams
    (``RouterCost.per_stream``, which needs the whole fleet's); otherwise the run stays in this process. Every
    worker replays the whole arrival sequence and simulates its own replicas, so each request's results are
    exactly those of the single-process run.

    ``on_pass(replica, plan, start, end, delivered)`` is called after every simulated pass, before the scheduler
    applies it, with when its tokens reach their clients (a pass-level trace; the run then stays in this process).

    ``routes``: the replica of each request (by its index in the workload), decided beforehand instead of by the
    balancer, e.g. a real router's choices: the replicas' own error apart from the routing's.
    """
    costs = config.costs()
    if isinstance(workload, Workload):
        workload = with_rate(workload, config)
    table = workload if isinstance(workload, RequestTable) else workload.generate(
        seed if workload_seed is None else workload_seed)
    clients = workload.clients if isinstance(workload, Workload) and workload.arrivals == "closed" else 0
    max_concurrency = workload.max_concurrency if isinstance(workload, Workload) else None
    temperature = workload.temperature if isinstance(workload, Workload) else 1.0
    n = len(table)
    if not (0 <= warmup < 1 and 0 <= cooldown < 1 and warmup + cooldown < 1):
        raise ValueError(f"--warmup ({warmup}) and --cooldown ({cooldown}) must be shares in [0, 1) summing below 1")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    check_fits(table, costs, config)
    if routes is not None:
        if len(routes) != n or not all(isinstance(r, (int, np.integer)) and 0 <= r < len(costs) for r in routes):
            raise ValueError(f"routes must give each of the {n} requests a replica index in [0, {len(costs)}), "
                             f"got {len(routes)} routes")
        routes = [int(r) for r in routes]
    log_args = (int(n * warmup), n - int(n * cooldown), token_times)  # RequestLog(measured from, to, token times)
    if workers is None:
        workers = (os.cpu_count() or 1) if n >= PARALLEL_MIN_REQUESTS else 1
    workers = min(workers, len(costs))
    router = config.routed()
    if (workers > 1 and not clients and not max_concurrency and on_pass is None and routes is None
            and config.policy.balancer in STATE_FREE_BALANCERS and not (router is not None and router.per_stream)
            and _can_fork()):
        log, stats = _simulate_parallel(table, costs, config, seed, log_args, workers, progress, temperature)
    else:
        log, stats = _run(table, costs, config, seed, log_args, clients, progress, choices=routes, on_pass=on_pass,
                          max_concurrency=max_concurrency, temperature=temperature)
    meta = {"workload": workload if isinstance(workload, Workload) else None, "warmup": warmup, "cooldown": cooldown}
    return _result(log, stats, config, seed, meta)


def _run(table: RequestTable, costs: list, config: ClusterConfig, seed: int, log_args: tuple,
         clients: int = 0, progress: bool = False, choices: list[int] | None = None,
         own: set[int] | None = None, on_pass=None,
         max_concurrency: int | None = None, temperature: float = 1.0) -> tuple[RequestLog, list[dict]]:
    """Simulate in this process. ``choices`` (the replica of each request, decided beforehand) and ``own`` (the
    replicas simulated here; requests for others are skipped) are for a worker of ``_simulate_parallel``.
    ``max_concurrency``: the open loop's cap on requests in flight (``Workload.max_concurrency``); ``temperature``:
    the requests' sampling temperature (``Workload.temperature``)."""
    n = len(table)
    env = simpy.Environment()
    log = RequestLog(*log_args)
    balancer = make_balancer(config.policy.balancer, seed)
    bar = _progress_bar(n) if progress else None
    waiters: dict[int, simpy.Event] = {}

    streams = [0]  # requests sent and not yet finished: the streams open at a fleet's router

    def on_finish(request: Request, replica: Replica) -> None:
        streams[0] -= 1
        log.record(request, replica.index)
        if bar is not None and len(log) % 1024 == 0:
            bar.update(1024)
        if waiters:
            event = waiters.pop(request.request_id, None)
            if event is not None:
                event.succeed(request.finish_time)

    router = config.routed()
    per_stream = router is not None and router.per_stream  # its hop grows with the streams open at it
    hop_out = None
    if router is not None:
        hop_out = (lambda: router.delivery_seconds(streams[0])) if per_stream else (lambda: router.delivery_s)
    replicas = [Replica(env, i, cost, config.policy, config.noise, seed, on_finish, on_pass, hop_out)
                if own is None or i in own else None for i, cost in enumerate(costs)]
    loads = _Loads(replicas, balancer.reads_kv_usage)
    choose = balancer.choose
    prompts = table.prompt_tokens.tolist()
    outputs = table.output_tokens.tolist()
    prefix_ids = table.prefix_ids.tolist() if table.prefix_ids is not None else None
    prefix_lens = table.prefix_lens.tolist() if table.prefix_lens is not None else None
    params: dict[int, SamplingParams] = {}  # one per output length: requests only read them
    # The serving path's delays (zero unless the cost model was measured through a server): a request reaches its
    # replica's engine some time after the client sent it, and tokens reach the client some time after their pass.
    # A constant router's hop in is drawn with them; one that grows with the streams open is added at each send.
    admission = admission_delays(table, costs, seed, None if per_stream else router)

    def hop_in(i: int) -> float:
        # from request i's send, now, until its replica has it
        return admission[i] + router.admission_seconds(streams[0]) if per_stream else admission[i]

    def send(i: int, sent: float) -> None:
        replica = replicas[choose(loads) if choices is None else choices[i]]
        if replica is None:  # another worker's replica
            return
        n = outputs[i]
        if n not in params:
            params[n] = SamplingParams(max_tokens=n, ignore_eos=True, temperature=temperature)
        request = Request(i, None, params[n], sent,
                          num_prompt_tokens=prompts[i], max_model_len=replica.cost.max_model_len,
                          prefix_id=prefix_ids[i] if prefix_ids else None,
                          prefix_len=prefix_lens[i] if prefix_lens else 0)
        replica.submit(request)

    def open_loop():
        # Workers replay every arrival (not only their own), so that the clock and the order of events at equal
        # times are exactly those of the single-process run.
        now = 0.0
        if per_stream:  # each request's way in depends on the streams open when it was sent
            for i, sent in sorted(enumerate(table.arrivals.tolist()), key=lambda pair: pair[1]):
                if sent > now:
                    yield env.timeout(sent - now)
                    now = sent
                hop = env.timeout(hop_in(i))
                hop.callbacks.append(lambda _, i=i, sent=sent: send(i, sent))
                streams[0] += 1
            return
        for i, reach, sent in arrival_order(table, admission):
            streams[0] += 1
            if reach > now:
                yield env.timeout(reach - now)
                now = reach
            send(i, sent)

    def round_trip(i: int):
        # the client sends request i now and has its last token when this process ends
        done = waiters[i] = env.event()
        sent = env.now
        delay = hop_in(i)
        streams[0] += 1
        if delay:
            yield env.timeout(delay)
        send(i, sent)
        yield done
        finish = done.value  # when the client has the last token: the next request is sent then
        if finish > env.now:
            yield env.timeout(finish - env.now)

    next_id = [0]

    def client():
        while next_id[0] < n:
            i = next_id[0]
            next_id[0] += 1
            yield from round_trip(i)

    def capped_open_loop():
        # requests due while max_concurrency are in flight wait in arrival order (a FIFO resource) and are sent,
        # their latencies starting, when one finishes
        slots = simpy.Resource(env, capacity=max_concurrency)

        def capped(i: int):
            with slots.request() as slot:
                yield slot
                yield from round_trip(i)

        now = 0.0
        for i, due in enumerate(table.arrivals.tolist()):
            if due > now:
                yield env.timeout(due - now)
                now = due
            env.process(capped(i))

    def report_kv_usage():
        # The router hears each replica's KV usage from its periodic health checks, and adds what it sent since.
        # Its checks keep their own clock, which the workload does not start: the first comes at a phase the seed
        # draws (least-kv's choices, and a run's TTFT near saturation, depend on it).
        yield env.timeout(float(np.random.default_rng([seed, 0x4B56]).uniform(0, config.policy.kv_report_interval)))
        while len(log) < n:
            for replica in replicas:
                if replica is not None:
                    replica.reported_kv_usage = replica.kv_usage_now
                    replica.reported_outstanding_tokens = replica.outstanding_tokens
                    replica.reported_unstarted_tokens = replica.unstarted_tokens
            yield env.timeout(config.policy.kv_report_interval)

    if clients:
        for _ in range(clients):
            env.process(client())
    elif max_concurrency:
        env.process(capped_open_loop())
    else:
        env.process(open_loop())
    if balancer.reads_kv_usage and choices is None:
        env.process(report_kv_usage())
    # The run allocates many short-lived objects and few cycles: collect the young generation less often, and
    # leave the objects that exist before the run out of full collections.
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], 50_000), *thresholds[1:])
    try:
        env.run()
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    if bar is not None:
        bar.update(len(log) - bar.n)
        bar.close()
    expected = n if own is None else sum(1 for c in choices if c in own)
    if len(log) != expected:
        raise RuntimeError(f"simulation ended with {expected - len(log)} of {expected} requests unfinished")
    log.flush()
    return log, [r.stats() for r in replicas if r is not None]


def _simulate_parallel(table: RequestTable, costs: list, config: ClusterConfig, seed: int,
                       log_args: tuple, workers: int, progress: bool,
                       temperature: float = 1.0) -> tuple[RequestLog, list[dict]]:
    """Decide every request's replica up front (the balancer ignores replica state), simulate the replicas in
    ``workers`` processes (replica i in worker i % workers), and merge their logs."""
    import multiprocessing

    choose = make_balancer(config.policy.balancer, seed).choose
    everyone = range(len(costs))  # state-free balancers only look at how many replicas there are
    choices = [0] * len(table)
    for i, _, _ in arrival_order(table, admission_delays(table, costs, seed, config.routed())):  # as _run does
        choices[i] = choose(everyone)
    jobs = [(table, costs, config, seed, log_args, choices, set(range(w, len(costs), workers)), temperature)
            for w in range(workers)]
    global _FORKED_JOBS
    _FORKED_JOBS = jobs  # handed to forked workers by inheritance, not pickled
    try:
        context = multiprocessing.get_context("fork")
        with context.Pool(workers) as pool:
            parts = pool.map(_worker, range(workers))
    finally:
        _FORKED_JOBS = None
    log = RequestLog(*log_args)
    stats = []
    for part_log, part_stats in parts:
        log.merge(part_log)
        stats.extend(part_stats)
    stats.sort(key=lambda s: s["index"])
    if progress:
        print(f"simulated {len(table)} requests in {workers} worker processes")
    return log, stats


_FORKED_JOBS: list | None = None


def _can_fork() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def _worker(w: int) -> tuple[RequestLog, list[dict]]:
    table, costs, config, seed, log_args, choices, own, temperature = _FORKED_JOBS[w]
    return _run(table, costs, config, seed, log_args, choices=choices, own=own, temperature=temperature)


def _progress_bar(total: int):
    from tqdm.auto import tqdm  # a widget in Jupyter, text on a terminal

    return tqdm(total=total, unit="req", desc="simulating", leave=False)


def _result(log: RequestLog, replicas: list[dict], config: ClusterConfig, seed: int, meta: dict) -> SimResult:
    columns = log.to_columns()
    span = float(columns["finish"].max() - columns["arrival"].min()) if len(columns["id"]) else 0.0
    costs = config.costs()
    rows = []
    for r in replicas:
        passes, hist, kv_usage = r["passes"], r["tokens_per_pass"], r["kv_usage"]
        tokens = float(np.dot(np.arange(len(hist)), hist))
        energy = getattr(costs[r["index"]], "energy", None)  # a profile's energy model, if it has one
        rows.append({"replica": r["index"], "requests": r["requests"], "passes": passes,
                     "busy_time": r["busy_time"], "busy_share": r["busy_time"] / span if span else float("nan"),
                     "preemptions": r["preemptions"],
                     "mean_tokens_per_pass": tokens / max(passes, 1),
                     "energy_j": float("nan") if energy is None else
                     energy.run_joules(span, passes, tokens, r["decode_context"], r["prefill_attention"]),
                     "mean_kv_usage": float(np.mean(kv_usage)) if kv_usage else 0.0,
                     "peak_kv_usage": float(np.max(kv_usage)) if kv_usage else 0.0,
                     "kv_blocks": r["kv_blocks"],
                     **{f"ahead_{k}": v for k, v in r["pipeline"].items()}})
    kv_parts = [(r["index"], r["kv_times"], r["kv_usage"]) for r in replicas]
    width = max(len(r["tokens_per_pass"]) for r in replicas)
    tokens = np.zeros((len(replicas), width), dtype=np.int64)
    for r in replicas:
        tokens[r["index"], :len(r["tokens_per_pass"])] = r["tokens_per_pass"]
    return SimResult(columns, rows, kv_parts, tokens, log, config, seed, meta)
