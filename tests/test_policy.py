"""Property tests of the torch-free policy layer: block manager and schedulers."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.policy import SCHEDULERS, BlockManager, PolicyConfig, Request, RequestState, SamplingParams
from engine.policy import make_scheduler as make_policy_scheduler


def make_scheduler(name: str, num_blocks: int, block_size: int, max_model_len: int | None = None, **policy):
    """A scheduler by name with its own block manager of ``num_blocks`` blocks."""
    return make_policy_scheduler(PolicyConfig(scheduler=name, block_size=block_size, **policy), num_blocks,
                                 max_model_len)


def make_request(rid, prompt_len, max_tokens, arrival=0.0, vocab=None, prefix=None):
    if vocab is None:
        return Request(rid, None, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival,
                       num_prompt_tokens=prompt_len)
    tokens = list(prefix or []) + [(rid * 7919 + i) % vocab for i in range(prompt_len)]
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival)


def check_blocks(bm: BlockManager, requests) -> None:
    """Reference counts equal table membership; free blocks are exactly the unreferenced ones."""
    owners = Counter(b for r in requests for b in r.block_table)
    counts, free = bm.ref_counts, set(bm.free_blocks)  # snapshots
    for block in range(bm.num_blocks):
        assert counts[block] == owners.get(block, 0), block
        assert (block in free) == (owners.get(block, 0) == 0), block
    for r in requests:
        assert len(r.block_table) == len(set(r.block_table)), "a request holds one block twice"
        if r.state is RequestState.RUNNING:
            assert len(r.block_table) * bm.block_size >= r.num_computed_tokens


def run_to_completion(sched, requests, arrivals_per_pass=None, fake_tokens=False, max_passes=100_000):
    """Drive a scheduler as the engine does; check invariants after every pass. Returns pass plans' sizes."""
    pending = list(requests)
    finished = Counter()
    sizes = []
    now = 0.0
    for _ in range(max_passes):
        take = len(pending) if arrivals_per_pass is None else arrivals_per_pass
        for r in pending[:take]:
            sched.add(r)
        pending = pending[take:]
        plan = sched.schedule(now)
        if plan is None:
            assert not sched.has_unfinished()
            if not pending:
                break
            continue
        assert 0 < plan.num_tokens <= sched.token_budget
        assert len(set(map(id, plan.requests))) == plan.num_seqs, "a request appears twice in one pass"
        assert all(r.state is RequestState.RUNNING for r in plan.requests)
        assert plan.num_seqs <= sched.max_num_seqs
        sizes.append((plan.num_tokens, bool(sched.waiting), len(plan.preempted)))
        sampled = [1] * sum(plan.samples) if fake_tokens else None
        now += 1.0
        for r in sched.update(plan, sampled, now):
            finished[r.request_id] += 1
        check_blocks(sched.block_manager, requests)
    else:
        pytest.fail("did not finish")
    assert all(finished[r.request_id] == 1 for r in requests), "a request was lost or finished twice"
    assert all(r.num_output_tokens == r.max_tokens and r.is_finished for r in requests)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks, "blocks leaked"
    return sizes


workloads = st.lists(st.tuples(st.integers(1, 120), st.integers(1, 40)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(workloads, st.integers(1, 4), st.sampled_from([4, 8, 16]), st.integers(0, 200),
       st.integers(1, 8), st.sampled_from(sorted(SCHEDULERS)), st.booleans())
def test_every_request_finishes_once_and_nothing_leaks(lengths, arrivals, block_size, spare_blocks, max_seqs,
                                                      name, prefix_tokens):
    shared = [3, 1, 4, 1, 5, 9, 2, 6] * 4
    requests = [make_request(i, p, o, arrival=float(i), vocab=50 if prefix_tokens else None,
                             prefix=shared if prefix_tokens and i % 2 else None)
                for i, (p, o) in enumerate(lengths)]
    longest = max(r.num_prompt_tokens + r.max_tokens for r in requests)
    num_blocks = -(-longest // block_size) + spare_blocks  # the largest request always fits alone
    budget = longest if name != "splitfuse" else max(1, longest // 3)
    sched = make_scheduler(name, num_blocks, block_size, token_budget=budget, max_num_seqs=max_seqs)
    run_to_completion(sched, requests, arrivals_per_pass=arrivals, fake_tokens=prefix_tokens)


@settings(max_examples=40, deadline=None)
@given(workloads, st.integers(1, 64))
def test_splitfuse_fills_the_budget_exactly_when_work_waits(lengths, budget):
    # memory never binds here
    sched = make_scheduler("splitfuse", 10_000, 16, token_budget=budget, max_num_seqs=10_000)
    requests = [make_request(i, p, o) for i, (p, o) in enumerate(lengths)]
    for num_tokens, work_waiting, _ in run_to_completion(sched, requests):
        if work_waiting:
            assert num_tokens == budget


def test_preemption_happens_when_blocks_run_short_and_loses_nothing():
    # 48 token slots for 6 requests of up to 40 tokens each
    sched = make_scheduler("splitfuse", 12, 4, token_budget=16, max_num_seqs=8)
    requests = [make_request(i, 20, 20, arrival=float(i)) for i in range(6)]
    sizes = run_to_completion(sched, requests)
    assert sched.num_preemptions > 0
    assert any(preempted for *_, preempted in sizes)
    assert sum(r.num_preemptions for r in requests) == sched.num_preemptions


def test_victim_is_the_most_recently_arrived_running_request():
    sched = make_scheduler("splitfuse", 6, 4, token_budget=64, max_num_seqs=8)
    a, b, c = (make_request(i, 8, 10, arrival=float(i)) for i in range(3))
    for r in (a, b, c):
        sched.add(r)
    plan = sched.schedule(0.0)  # admits all three prompts: 6 blocks, cache full
    assert [r.request_id for r in plan.requests] == [0, 1, 2]
    sched.update(plan, None, 1.0)
    plan = sched.schedule(1.0)  # every decode needs a 3rd block: c, the newest, makes room for a and b
    assert [r.request_id for r in plan.preempted] == [2]
    assert [r.request_id for r in plan.requests] == [0, 1]
    assert [r.request_id for r in sched.waiting] == [2] and c.state is RequestState.PREEMPTED
    assert c.block_table == [] and c.num_computed_tokens == 0


def test_prefix_cache_reuses_full_prompt_blocks():
    sched = make_scheduler("splitfuse", 64, 4, token_budget=64)
    shared = list(range(10, 22))  # 12 tokens = 3 full blocks
    first = Request("a", shared + [1, 2], SamplingParams(max_tokens=2, ignore_eos=True))
    second = Request("b", shared + [3], SamplingParams(max_tokens=2, ignore_eos=True))
    sched.add(first)
    while sched.has_unfinished():
        plan = sched.schedule()
        sched.update(plan, [0] * sum(plan.samples))
    sched.add(second)
    plan = sched.schedule()
    assert second.num_cached_tokens == 12
    assert plan.start_positions == [12] and plan.num_new_tokens == [1]


def test_prefix_cache_leaves_one_token_to_compute():
    sched = make_scheduler("splitfuse", 64, 4, token_budget=64)
    bm = sched.block_manager
    prompt = list(range(8))  # exactly two blocks
    for rid in ("a", "b"):
        sched.add(Request(rid, prompt, SamplingParams(max_tokens=1, ignore_eos=True)))
        plan = sched.schedule()
        assert plan.num_prefill_tokens >= 1 and plan.samples == [True]
        sched.update(plan, [0])
    assert bm.num_free_blocks == 64


def test_abort_frees_blocks_and_removes_the_request():
    sched = make_scheduler("splitfuse", 16, 4, token_budget=8)
    bm = sched.block_manager
    keep, drop = make_request("keep", 10, 5), make_request("drop", 10, 5)
    sched.add(keep)
    sched.add(drop)
    plan = sched.schedule()
    sched.update(plan)
    assert sched.abort("drop") is drop and drop.finish_reason == "abort"
    assert sched.abort("unknown") is None
    while sched.has_unfinished():
        sched.update(sched.schedule())
    assert keep.num_output_tokens == 5 and bm.num_free_blocks == 16


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_requests_that_can_never_fit_are_rejected_clearly(name):
    sched = make_scheduler(name, 4, 4, token_budget=64, max_model_len=32)  # 16 tokens
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add(make_request("big", 10, 10))
    with pytest.raises(ValueError, match="context"):
        sched.add(make_request("long", 40, 1))
    assert not sched.has_unfinished()


def test_prefill_first_needs_a_budget_that_covers_the_prompt():
    sched = make_scheduler("prefill-first", 100, 4, token_budget=8)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        sched.add(make_request("p", 9, 1))


def test_prefill_first_budget_counts_the_output_up_to_the_context():
    """A recompute after preemption holds the prompt and the output so far, which stops at the context limit: a
    request asking for more output than fits needs no budget beyond it (a client capped its max_tokens so)."""
    sched = make_scheduler("prefill-first", 100, 4, token_budget=32, max_model_len=32)
    request = Request("r", None, SamplingParams(max_tokens=40, ignore_eos=True), 0.0, num_prompt_tokens=20,
                      max_model_len=32)
    sched.add(request)
    while sched.has_unfinished():
        sched.update(sched.schedule())
    assert request.num_output_tokens == 12
    short = make_scheduler("prefill-first", 100, 4, token_budget=30, max_model_len=32)
    with pytest.raises(ValueError, match="prompt \\+ output - 1 = 31"):
        short.add(Request("s", None, SamplingParams(max_tokens=40, ignore_eos=True), 0.0, num_prompt_tokens=20,
                          max_model_len=32))


def test_prefill_first_never_mixes_prompts_and_decodes():
    sched = make_scheduler("prefill-first", 100, 4, token_budget=64)
    requests = [make_request(i, 5 + i, 6, arrival=float(i)) for i in range(6)]
    pending = list(requests)
    while pending or sched.has_unfinished():
        if pending:
            sched.add(pending.pop(0))
        plan = sched.schedule()
        assert plan.num_decodes in (0, plan.num_seqs)
        sched.update(plan)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"), ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_scheduler_config_is_rejected():
    with pytest.raises(ValueError, match="unknown scheduler"):
        make_scheduler("fifo", 4, 4)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_scheduler("splitfuse", 4, 4, token_budget=0)
    with pytest.raises(ValueError, match="empty"):
        Request("e", [])


def test_policy_layer_does_not_import_torch():
    import subprocess

    code = "import engine, sys; assert 'torch' not in sys.modules, 'engine imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "give_back", "remove"]), st.integers(0, 40)), max_size=80))
def test_free_block_queue_behaves_as_an_ordered_set(ops):
    """``FreeBlockQueue`` (stale entries, taken in runs) against a plain list used as the ordered set it stands for."""
    from engine.policy.block_manager import FreeBlockQueue

    queue, reference, held = FreeBlockQueue(range(12)), list(range(12)), []
    for op, n in ops:
        if op == "take":
            n = min(n, len(reference))
            taken = queue.take(n)
            assert taken == reference[:n]
            del reference[:n]
            held += taken
        elif op == "give_back" and held:
            back = held[-(n % len(held) + 1):][::-1]  # the tail, reversed: as a request's blocks come back
            del held[-len(back):]
            queue.give_back(back)
            reference += back
        elif op == "remove" and reference:
            block = reference.pop(n % len(reference))  # a cache hit on a free block
            queue.remove(block)
            held.append(block)
        assert queue.size == len(reference) and list(queue) == reference
