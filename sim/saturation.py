"""The cluster's rough saturation rate, and the arrival rate a run without one uses (``Workload.load`` of it)."""

from __future__ import annotations

import dataclasses

from engine.policy import BatchPlan, plan_features, scheduler_class
from sim.workload import Workload


def engine_concurrency(policy, kv_tokens: int, workload: Workload) -> int:
    """How many of ``workload``'s requests one engine holds at once: ``policy.max_num_seqs``, or fewer when its KV
    cache (``kv_tokens``) fills first with requests of the mean lengths."""
    p, o = workload.mean_lengths()
    by_kv = kv_tokens / (p + o)
    return max(1, int(min(policy.max_num_seqs, by_kv)))


def estimate_capacity(config, workload: Workload) -> float:
    """Rough saturation rate (requests/s) of the cluster ``config`` (a ``sim.cluster.ClusterConfig``; not imported
    here, which ``sim.cluster`` imports), from one typical pass per replica at the workload's mean lengths (a
    trace's own, or the clipped sampled ones). A replica finishes a request per ``o`` decodes and feeds a new one
    ``p`` prompt tokens, so in steady state a pass holds ``D`` decodes and ``D p / o`` prompt tokens, ``D`` as many
    as fit both the token budget (``max_num_batched_tokens``) and the requests the engine holds at once
    (``engine_concurrency``). The prompt tokens run as equal chunks of at most one prompt each, beside the decodes
    or, for a scheduler that does not mix them (prefill-first), in a pass of their own. A starting point for
    sweeps, not a result."""
    p, o = workload.mean_lengths()
    budget = config.policy.max_num_batched_tokens
    mixes = scheduler_class(config.policy.scheduler).mixes_prompts_and_decodes
    rate = 0.0
    for cost in config.costs():
        decodes = max(1, min(round(budget * o / (p + o)), budget - 1,
                             engine_concurrency(config.policy, cost.num_kv_blocks * cost.block_size, workload)))
        prefill = max(1, min(round(decodes * p / o), budget - decodes))
        seconds = _pass_seconds(cost, decodes, prefill, -(-prefill // max(1, round(p))), p, o, mixes)
        if not seconds > 0:  # a model fitted on few small passes can price many prompts in one pass at <= 0 s
            seconds = _pass_seconds(cost, decodes, prefill, 1, p, o, mixes)
        if not seconds > 0:
            raise ValueError(f"the cost model prices a pass of {decodes} decodes and {prefill} prompt tokens at "
                             f"{seconds:.3g} s: no capacity can be estimated from it")
        rate += decodes / o / seconds
    return rate


STEADY_ROUNDS = 50  # rounds of the steady pass stream run before the one priced


def _pass_seconds(cost, decodes: int, prefill: int, chunks: int, p: float, o: float, mixes: bool) -> float:
    """Predicted seconds of ``decodes`` decodes halfway through their outputs and ``prefill`` prompt tokens as
    ``chunks`` equal chunks, each halfway through what is left of its prompt: one pass, or two where the scheduler
    does not mix them; where the cost has a heat (``CostModel.new_heat``), in a steady stream of such passes."""
    sizes = [prefill // chunks + (i < prefill % chunks) for i in range(chunks)]
    decode = BatchPlan(num_new_tokens=[1] * decodes, start_positions=[p + o / 2 - 1] * decodes,
                       samples=[True] * decodes, num_decodes=decodes, num_prefill_tokens=0)
    prompts = BatchPlan(num_new_tokens=sizes, start_positions=[max(0.0, (p - size) / 2) for size in sizes],
                        samples=[prefill >= round(p)] * chunks, num_decodes=0, num_prefill_tokens=prefill)
    features = [plan_features(plan) for plan in ([_joined(decode, prompts)] if mixes else [decode, prompts])]
    heat = cost.new_heat() if hasattr(cost, "new_heat") else None  # optional in CostModel
    if heat is None:
        return sum(cost.predict(f) for f in features)
    now = seconds = 0.0
    for _ in range(STEADY_ROUNDS):  # the card's heat settles within a few of its time constants
        seconds = 0.0
        for f in features:
            t = cost.predict(f, heat.at(now))
            heat.add(now, now + t, f.prefill_tokens)
            now, seconds = now + t, seconds + t
    return seconds


def _joined(decode: BatchPlan, prompts: BatchPlan) -> BatchPlan:
    return BatchPlan(num_new_tokens=decode.num_new_tokens + prompts.num_new_tokens,
                     start_positions=decode.start_positions + prompts.start_positions,
                     samples=decode.samples + prompts.samples,
                     num_decodes=decode.num_decodes, num_prefill_tokens=prompts.num_prefill_tokens)


def with_rate(workload: Workload, config) -> Workload:
    """``workload`` itself, or, for open-loop arrivals without a rate, a copy at ``workload.load`` x the
    cluster's estimated capacity (what ``splitfuse simulate`` without ``--rate`` runs)."""
    if workload.arrivals not in ("poisson", "gamma") or workload.rate is not None:
        return workload
    if not workload.load > 0:
        raise ValueError(f"--load must be > 0, got {workload.load!r}")
    return dataclasses.replace(workload, rate=workload.load * estimate_capacity(config, workload))
