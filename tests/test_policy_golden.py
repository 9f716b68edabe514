"""The policy layer against golden traces of what it did when they were recorded (``tests/golden/``).

Each seeded workload drives one scheduler and block manager pass by pass; after every pass the trace records the
plan (request ids, new tokens, start positions, samples, decode and prefill counts, preempted ids, cost
features), the finished requests, the running and waiting queues, every request's state and block table, and the
block manager's free-list order, reference counts and cached blocks (that bulky state as a digest); at the end,
every request's times, tokens and finish reason. Workloads cover all three schedulers, tight KV caches
(preemptions), prefix caching with shared prefixes (by token ids and by ``prefix_id``), tiny token budgets and
``max_num_seqs``, staggered arrivals, aborts, context limits, and real-token requests with stop tokens, EOS and
``min_tokens``.

A refactor or a speed-up must leave every trace as it is. A change of behaviour that is meant regenerates the
file on purpose (the workloads' summary below shows what changed), reviewed with the change:

    python tests/test_policy_golden.py --regenerate
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import sys
from pathlib import Path

import pytest

from engine.policy import BlockManager, PolicyConfig, Request, SamplingParams, make_scheduler, plan_features

GOLDEN = Path(__file__).parent / "golden" / "policy_traces.json.gz"
VOCAB = 24  # small, so that stop tokens and EOS come up often
EOS = 2
NUM_WORKLOADS = 48


def make_spec(seed: int) -> dict:
    """A workload and replica configuration drawn from ``seed``."""
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
            # record_times: whether the trace shows token times (when the traces were recorded, a request could be
            # made without them)
            "max_model_len": max_model_len, "record_times": rng.random() < 0.8, "requests": requests,
            "arrivals": arrivals, "aborts": aborts, "token_seed": seed}


def sampled_token(seed: int, request_id: int, position: int) -> int:
    return random.Random(seed * 1_000_003 + request_id * 1009 + position).randrange(VOCAB)


def digest(value) -> str:
    """A short fingerprint of a bulky state (every request, every block): the file stays small, and a difference
    still shows at the pass where it first appears."""
    return hashlib.sha1(json.dumps(value).encode()).hexdigest()[:10]


def run(spec: dict) -> list:
    """Drive the policy layer through the workload; returns the trace of everything it did (JSON values)."""
    config = PolicyConfig(scheduler=spec["name"], token_budget=spec["budget"], block_size=spec["block_size"],
                          max_num_seqs=spec["max_num_seqs"], enable_prefix_caching=spec["caching"])
    sched = make_scheduler(config, spec["num_blocks"], max_model_len=spec["max_model_len"])
    bm: BlockManager = sched.block_manager
    requests = []
    for r in spec["requests"]:
        params = SamplingParams(**r["params"])
        if "tokens" in r:
            req = Request(r["id"], r["tokens"], params, float(r["id"]), eos_token_id=EOS,
                          max_model_len=spec["max_model_len"])
        else:
            req = Request(r["id"], None, params, float(r["id"]), num_prompt_tokens=r["num_prompt_tokens"],
                          prefix_id=r["prefix_id"], prefix_len=r["prefix_len"], max_model_len=spec["max_model_len"])
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
                    trace.append(["rejected", req.request_id, str(e)])
        if step in spec["aborts"]:
            aborted = sched.abort(spec["aborts"][step])
            trace.append(["abort", aborted.request_id if aborted is not None else None])
        plan = sched.schedule(now)
        if plan is None:
            trace.append(["idle", step])
            if not pending and not sched.has_unfinished():
                break
            continue
        trace.append(["plan", [r.request_id for r in plan.requests], list(plan.num_new_tokens),
                      list(plan.start_positions), list(plan.samples), plan.num_decodes, plan.num_prefill_tokens,
                      plan.num_tokens, plan.num_seqs, [r.request_id for r in plan.preempted],
                      list(plan_features(plan))])
        sampled = None
        if real_tokens:
            sampled = [sampled_token(spec["token_seed"], r.request_id, s + n)
                       for r, s, n, sample in zip(plan.requests, plan.start_positions, plan.num_new_tokens,
                                                  plan.samples) if sample]
        now += 0.25 + 0.01 * (step % 7)
        finished = sched.update(plan, sampled, now)
        stats = sched.stats()
        trace.append(["after", [r.request_id for r in finished], [r.request_id for r in sched.running],
                      [r.request_id for r in sched.waiting], stats.num_preemptions])
        # Simulated requests (no token ids) publish their own prompt blocks when preempted rather than after every
        # pass: the same prefix-cache hits with less work. Only for real tokens are the cache's reference counts
        # and published blocks pass-by-pass facts.
        eager = real_tokens
        trace.append(["state", digest([[[int(r.state), list(r.block_table), r.num_computed_tokens,
                                         r.num_output_tokens, r.num_preemptions] for r in requests],
                                       bm.free_blocks, bm.ref_counts if eager else None,
                                       bm.cached_blocks if eager else None]),
                      sum(bool(r.num_cached_tokens) for r in requests), stats.num_free_blocks, stats.kv_usage])
    else:
        pytest.fail("workload did not finish")
    for r in requests:
        trace.append(["end", r.request_id, int(r.state), r.scheduled_time, r.first_token_time, r.last_token_time,
                      list(r.token_times) if spec["record_times"] else None, r.finish_time, r.finish_reason,
                      r.output_token_ids, r.num_output_tokens, r.num_tokens, r.is_finished])
    return json.loads(json.dumps(trace))  # tuples as lists, as the file holds them


def load_golden() -> dict:
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden()


@pytest.mark.parametrize("seed", range(NUM_WORKLOADS))
def test_policy_reproduces_its_golden_trace(golden, seed):
    spec = make_spec(seed)
    expected, live = golden[str(seed)], run(spec)
    for i, (a, b) in enumerate(zip(expected, live)):
        assert a == b, f"workload {seed} ({spec['name']}, {spec['kind']}): first difference at trace entry {i}"
    assert len(expected) == len(live)


def test_the_workloads_exercise_what_they_should(golden):
    """Preemptions, prefix-cache hits, stops before max_tokens, rejections and aborts all occur somewhere."""
    seen = {"preempted": 0, "cached": 0, "stop": 0, "rejected": 0, "abort": 0, "decode_and_prefill": 0}
    for trace in golden.values():
        for entry in trace:
            kind = entry[0]
            if kind == "plan":
                seen["preempted"] += bool(entry[9])
                seen["decode_and_prefill"] += bool(entry[5] and entry[6])
            elif kind in ("rejected", "abort"):
                seen[kind] += 1
            elif kind == "end":
                seen["stop"] += entry[8] == "stop"
            elif kind == "state":
                seen["cached"] += entry[2] > 0
    assert all(seen.values()), seen


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    GOLDEN.parent.mkdir(exist_ok=True)
    with gzip.GzipFile(GOLDEN, "wb", mtime=0) as f:
        f.write(json.dumps({str(seed): run(make_spec(seed)) for seed in range(NUM_WORKLOADS)}).encode())
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size / 1e3:.0f} kB)")
