"""The live policy layer against a frozen copy of it (tests/_reference_policy): identical behaviour, pass by pass.

Speed work in engine/scheduler.py, request.py and block_manager.py must not change what the engine or the
simulator does. Each seeded workload here is driven through both layers side by side, and after every pass the
test compares the plan (request ids, new tokens, start positions, samples, decode and prefill counts, preempted
ids), the finished requests, every request's state and block table, and the block manager's free-list order,
reference counts and prefix-cache entries; at the end, every request's times, tokens and finish reason.
Workloads cover all three schedulers, tight KV caches (preemptions), prefix caching with shared prefixes (by
token ids and by ``prefix_id``), tiny token budgets and ``max_num_seqs``, staggered arrivals, aborts, context
limits, and real-token requests with stop tokens, EOS and ``min_tokens``.
"""

from __future__ import annotations

import random

import pytest
from _reference_policy import block_manager as ref_bm
from _reference_policy import request as ref_request
from _reference_policy import scheduler as ref_scheduler

from engine import block_manager as live_bm
from engine import request as live_request
from engine import scheduler as live_scheduler
from engine.sampling_params import SamplingParams

LAYERS = {"reference": (ref_scheduler, ref_request, ref_bm), "live": (live_scheduler, live_request, live_bm)}
VOCAB = 24  # small, so that stop tokens and EOS come up often
EOS = 2
NUM_WORKLOADS = 48


def make_spec(seed: int) -> dict:
    """A workload and replica configuration drawn from ``seed``; both layers build their objects from it."""
    rng = random.Random(seed)
    name = ("splitfuse", "prefill-first", "decode-first")[seed % 3]
    kind = ("counts", "prefix-id", "tokens")[(seed // 3) % 3]
    block_size = rng.choice([1, 2, 4, 4, 16])
    n = rng.randint(4, 60)
    shared = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(4, 40))] for _ in range(3)]
    requests = []
    for i in range(n):
        prompt = rng.randint(1, 90)
        output = rng.randint(1, 30)
        group = rng.randrange(4)  # 3: no shared prefix
        params = {"max_tokens": output, "ignore_eos": kind != "tokens" or rng.random() < 0.3}
        if kind == "tokens":
            if rng.random() < 0.5:
                params["stop_token_ids"] = rng.sample(range(VOCAB), rng.randint(1, 3))
            params["min_tokens"] = rng.randint(0, output)
        req = {"id": i, "params": params, "prefix_len": 0, "prefix_id": None}
        if kind == "tokens":
            head = shared[group] if group < 3 else []
            req["tokens"] = head + [rng.randrange(3, VOCAB) for _ in range(prompt)]
        else:
            req["num_prompt_tokens"] = prompt
            if kind == "prefix-id" and group < 3:
                req["num_prompt_tokens"] = prompt + len(shared[group])
                req["prefix_id"], req["prefix_len"] = group, len(shared[group])
        requests.append(req)
    lengths = [len(r.get("tokens", ())) or r["num_prompt_tokens"] for r in requests]
    longest = max(p + r["params"]["max_tokens"] for p, r in zip(lengths, requests))
    tight = rng.random() < 0.6
    num_blocks = -(-longest // block_size) + (rng.randint(0, 8) if tight else rng.randint(20, 400))
    if name == "splitfuse":
        budget = rng.choice([1, 2, 3, 5, 8, 16, 33, 64, 200, 1000])
    else:  # whole prompts (and recomputes after preemption) must fit one pass
        budget = longest + rng.choice([0, 0, 5, 60, 300])
    max_model_len = rng.choice([None, None, longest + 5, max(lengths) + 3, max(lengths)])  # the last rejects one
    arrivals = [rng.choice([0, 0, 1, 1, 2, 5]) for _ in range(4 * n)]  # requests added before each pass
    aborts = {rng.randrange(1, 60): rng.randrange(n) for _ in range(rng.choice([0, 0, 0, 2]))}
    return {"name": name, "kind": kind, "block_size": block_size, "num_blocks": num_blocks, "budget": budget,
            "max_num_seqs": rng.choice([1, 2, 3, 8, 256]), "caching": rng.random() < 0.75,
            "max_model_len": max_model_len, "record_times": rng.random() < 0.8, "requests": requests,
            "arrivals": arrivals, "aborts": aborts, "token_seed": seed}


def sampled_token(seed: int, request_id: int, position: int) -> int:
    return random.Random(seed * 1_000_003 + request_id * 1009 + position).randrange(VOCAB)


def run(layer: str, spec: dict) -> list:
    """Drive one layer through the workload; returns the fingerprint of everything it did."""
    scheduler_mod, request_mod, bm_mod = LAYERS[layer]
    bm = bm_mod.BlockManager(spec["num_blocks"], spec["block_size"], spec["caching"])
    sched = scheduler_mod.make_scheduler(spec["name"], bm, token_budget=spec["budget"],
                                         max_num_seqs=spec["max_num_seqs"], max_model_len=spec["max_model_len"])
    requests = []
    for r in spec["requests"]:
        params = SamplingParams(**r["params"])
        if "tokens" in r:
            req = request_mod.Request(r["id"], r["tokens"], params, float(r["id"]), eos_token_id=EOS,
                                      max_model_len=spec["max_model_len"], record_token_times=spec["record_times"])
        else:
            req = request_mod.Request(r["id"], None, params, float(r["id"]), num_prompt_tokens=r["num_prompt_tokens"],
                                      prefix_id=r["prefix_id"], prefix_len=r["prefix_len"],
                                      max_model_len=spec["max_model_len"], record_token_times=spec["record_times"])
        requests.append(req)
    real_tokens = spec["kind"] == "tokens"
    trace: list = []
    pending = list(requests)
    now = 0.0
    for step in range(100_000):
        for _ in range(spec["arrivals"][step] if step < len(spec["arrivals"]) else len(pending)):
            if pending:
                req = pending.pop(0)
                try:
                    sched.add(req)
                except ValueError as e:
                    trace.append(("rejected", req.request_id, str(e)))
        if step in spec["aborts"]:
            aborted = sched.abort(spec["aborts"][step])
            trace.append(("abort", aborted.request_id if aborted is not None else None))
        plan = sched.schedule(now)
        if plan is None:
            trace.append(("idle", step))
            if not pending and not sched.has_unfinished():
                break
            continue
        ids = [r.request_id for r in plan.requests]
        trace.append((ids, list(plan.num_new_tokens), list(plan.start_positions), list(plan.samples),
                      plan.num_decodes, plan.num_prefill_tokens, plan.num_tokens, plan.num_seqs,
                      [r.request_id for r in plan.preempted], plan.features()))
        sampled = None
        if real_tokens:
            sampled = [sampled_token(spec["token_seed"], r.request_id, s + n)
                       for r, s, n, sample in zip(plan.requests, plan.start_positions, plan.num_new_tokens,
                                                  plan.samples) if sample]
        now += 0.25 + 0.01 * (step % 7)
        finished = sched.update(plan, sampled, now)
        trace.append(([r.request_id for r in finished], [r.request_id for r in sched.running],
                      [r.request_id for r in sched.waiting], sched.num_preemptions))
        # Simulated requests publish their own blocks at preemption rather than after every pass (the live layer's
        # shortcut; the reference publishes eagerly): same hits, so only that bookkeeping is left out for them.
        eager = real_tokens
        trace.append([(int(r.state), tuple(r.block_table), r.num_computed_tokens, r.num_output_tokens,
                       r.num_cached_tokens, r.num_registered_blocks if eager else None, r.num_preemptions)
                      for r in requests])
        trace.append((list(bm.free_blocks), list(bm.ref_counts) if eager else None,
                      list(bm.block_hashes) if eager else None, dict(bm.cached) if eager else None,
                      bm.num_free_blocks, bm.num_used_blocks, bm.usage))
    else:
        pytest.fail("workload did not finish")
    for r in requests:
        trace.append((r.request_id, int(r.state), r.scheduled_time, r.first_token_time, r.last_token_time,
                       r.token_times, r.finish_time, r.finish_reason, r.output_token_ids, r.num_output_tokens,
                       r.num_tokens, r.is_finished))
    return trace


@pytest.mark.parametrize("seed", range(NUM_WORKLOADS))
def test_live_policy_layer_matches_the_frozen_reference(seed):
    spec = make_spec(seed)
    reference, live = run("reference", spec), run("live", spec)
    for i, (a, b) in enumerate(zip(reference, live)):
        assert a == b, f"workload {seed} ({spec['name']}, {spec['kind']}): first difference at trace entry {i}"
    assert len(reference) == len(live)


def test_the_workloads_exercise_what_they_should():
    """Preemptions, prefix-cache hits, stops before max_tokens, rejections and aborts all occur somewhere."""
    seen = {"preempted": 0, "cached": 0, "stop": 0, "rejected": 0, "abort": 0, "decode_and_prefill": 0}
    for seed in range(NUM_WORKLOADS):
        for entry in run("reference", make_spec(seed)):
            if isinstance(entry, tuple) and len(entry) == 10:
                seen["preempted"] += bool(entry[8])
                seen["decode_and_prefill"] += bool(entry[4] and entry[5])
            elif isinstance(entry, tuple) and entry and entry[0] in ("rejected", "abort"):
                seen[entry[0]] += 1
            elif isinstance(entry, tuple) and len(entry) == 12:
                seen["stop"] += entry[7] == "stop"
            elif isinstance(entry, list) and entry and isinstance(entry[0], tuple) and len(entry[0]) == 7:
                seen["cached"] += any(r[4] for r in entry)
    assert all(seen.values()), seen
