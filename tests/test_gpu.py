"""GPU checks (run on the device machine; CI has no GPU, so every test here is skipped without CUDA):
the Triton kernels against the references at Llama-2-7B sizes on random bf16 data, and generation through the
engine's GPU path (Triton kernels, CUDA graphs) against the reference path on the same GPU and model.

Random weights give near-ties (the top-2 logit gap of a random 7B model is often under bf16 noise), so free-
running greedy sequences part after a tie and are only reported. "Equal within bf16 tolerance" is checked
teacher-forced against an fp32 copy of the model: see ``test_generation_gpu_path_matches_reference_path``."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (device machine only)")]

DT = torch.bfloat16
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER = 32, 32, 128, 4096, 11008  # Llama-2-7B
TOL = 1e-2  # bf16 operands


def rel_err(out: torch.Tensor, expect: torch.Tensor) -> float:
    assert not out.isnan().any(), "NaN in output"
    return ((out.double() - expect.double()).norm() / expect.double().norm()).item()


def kernels_pair(module: str):
    from kernels import reference
    return reference, importlib.import_module(f"kernels.{module}")


def paged_batch(q_lens, ctxs, block_size=16):
    """A ragged batch over a cache whose blocks are scattered at random."""
    n_blocks = [-(-c // block_size) for c in ctxs]
    total = sum(n_blocks) + 4
    perm = torch.randperm(total, device="cuda", dtype=torch.int32)
    tables = torch.zeros(len(ctxs), max(n_blocks), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(n_blocks):
        tables[b, :n] = perm[used:used + n]
        used += n
    k = torch.randn(total, block_size, KV_HEADS, HEAD_DIM, device="cuda", dtype=DT)
    v = torch.randn_like(k)
    q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, device="cuda", dtype=DT)
    qsl = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device="cuda")
    return q, k, v, tables, torch.tensor(ctxs, dtype=torch.int32, device="cuda"), qsl


@pytest.mark.parametrize("q_lens,ctxs", [
    ([1] * 64 + [512], [1024] * 64 + [1536]),  # a SplitFuse pass: decodes and a chunk with a cached prefix
    ([1], [4000]),  # one long decode (split KV)
    ([2048], [2048]),  # a whole prefill
])
def test_paged_attention_full_size(q_lens, ctxs):
    ref, tri = kernels_pair("triton_attention")
    args = paged_batch(q_lens, ctxs)
    assert rel_err(tri.paged_attention(*args, HEAD_DIM ** -0.5), ref.paged_attention(*args, HEAD_DIM ** -0.5)) < TOL


def test_long_context_split_full_size():
    """Decodes at 1.5 programs per SM: the launch splits long contexts in two and leaves short ones whole."""
    ref, tri = kernels_pair("triton_attention")
    seqs = -(-3 * torch.cuda.get_device_properties(0).multi_processor_count // (2 * KV_HEADS))
    ctxs = [int(c) for c in torch.randint(1, 6000, (seqs,))]
    ctxs[:3] = [5000, 900, 2048]  # two splits, one short split, exactly two minimal splits
    args = paged_batch([1] * seqs, ctxs)
    (cfg,) = tri.default_config(args[0], args[1], args[3], args[4])
    assert cfg.num_splits == 2 and cfg.min_split_tiles == tri.LONG_SPLIT_MIN_TILES
    assert rel_err(tri.paged_attention(*args, HEAD_DIM ** -0.5), ref.paged_attention(*args, HEAD_DIM ** -0.5)) < TOL


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("n,k", [(12288, HIDDEN), (HIDDEN, INTER), (32000, HIDDEN)])
def test_linear_full_size(rows, n, k):
    ref, lin = kernels_pair("triton_linear")
    x = torch.randn(rows, k, device="cuda", dtype=DT)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(DT)
    assert rel_err(lin.linear_with(x, w, None, lin.default_config(rows, n, k)), ref.linear(x.float(), w.float())) < TOL


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_linear_silu_and_mul_full_size(rows):
    ref, lin = kernels_pair("triton_linear")
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=DT)
    w = (torch.randn(2 * INTER, HIDDEN, device="cuda") / HIDDEN ** 0.5).to(DT)
    out = lin.linear_silu_and_mul(x, w)
    assert out.shape == (rows, INTER) and rel_err(out, ref.linear_silu_and_mul(x.float(), w.float())) < TOL


def test_write_kv_full_size():
    ref, tri = kernels_pair("triton_attention")
    tokens = 4096
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device="cuda", dtype=DT)
    v = torch.randn_like(k)
    slots = torch.randperm(2 * tokens, device="cuda")[:tokens]
    slots[::7] = -1
    caches = [torch.randn(2 * tokens // 16, 16, KV_HEADS, HEAD_DIM, device="cuda", dtype=DT) for _ in range(2)]
    expect = [c.clone() for c in caches]
    ref.write_kv(k, v, *expect, slots)
    tri.write_kv(k, v, *caches, slots)
    assert all(torch.equal(a, b) for a, b in zip(caches, expect))


def test_norm_rotary_activation_full_size():
    ref, norm = kernels_pair("triton_norm")
    x, res = torch.randn(2048, HIDDEN, device="cuda", dtype=DT), torch.randn(2048, HIDDEN, device="cuda", dtype=DT)
    w = (1 + 0.1 * torch.randn(HIDDEN, device="cuda")).to(DT)
    (o, r), (o_ref, r_ref) = norm.rms_norm(x, w, 1e-5, res), ref.rms_norm(x, w, 1e-5, res)
    assert rel_err(o, o_ref) < TOL and torch.equal(r, r_ref)
    _, rot = kernels_pair("triton_rotary")
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    angles = torch.outer(torch.arange(4096, device="cuda").float(), inv)
    cache = torch.cat((angles.cos(), angles.sin()), -1)
    q = torch.randn(2048, HEADS, HEAD_DIM, device="cuda", dtype=DT)
    k = torch.randn(2048, KV_HEADS, HEAD_DIM, device="cuda", dtype=DT)
    pos = torch.randint(0, 4096, (2048,), device="cuda")
    q_expect, k_expect = ref.rotary_embedding(q, k, pos, cache)
    for out, expect in zip(rot.rotary_embedding(q, k, pos, cache), (q_expect, k_expect)):
        assert rel_err(out, expect) < TOL
    v = torch.randn_like(k)
    slots = torch.randperm(8192, device="cuda")[:2048]
    slots[::5] = -1
    caches = [torch.randn(8192 // 16, 16, KV_HEADS, HEAD_DIM, device="cuda", dtype=DT) for _ in range(2)]
    expect = [c.clone() for c in caches]
    ref.write_kv(k_expect, v, *expect, slots)
    q_out = rot.rotary_embedding_and_write_kv(q, k, v, pos, cache, *caches, slots)
    assert rel_err(q_out, q_expect) < TOL and rel_err(caches[0], expect[0]) < TOL and torch.equal(caches[1], expect[1])
    _, act = kernels_pair("triton_activation")
    gate_up = torch.randn(2048, 2 * INTER, device="cuda", dtype=DT)
    assert rel_err(act.silu_and_mul(gate_up), ref.silu_and_mul(gate_up)) < TOL


def fast_random_init(model, seed: int, std: float = 0.02) -> None:
    """Seeded normal weights drawn on the GPU (the engine's CPU-drawn init takes a minute for 7B)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=generator)


@pytest.fixture(scope="module")
def llama7b(monkeypatch_module):
    """A random-weight Llama-2-7B-shaped engine in bf16 on the GPU (Triton path, CUDA graphs)."""
    import engine.weights
    from engine.llm import LLM

    monkeypatch_module.setattr(engine.weights, "random_init", fast_random_init)
    llm = LLM("llama-2-7b", dtype="bfloat16", device="cuda", num_kv_blocks=512, max_num_seqs=16,
              token_budget=1024, enable_prefix_caching=False)
    yield llm
    del llm
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def reference_path(monkeypatch, llm=None):
    """Route every kernel through the PyTorch references (on the same GPU), eager."""
    import kernels
    from kernels import reference
    monkeypatch.setattr(kernels, "_impl", lambda module, x: reference)
    if llm is not None:
        monkeypatch.setattr(llm.engine.runner, "graphs", None)


@torch.inference_mode()
def score(model, config, tokens: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Logits [len, vocab] of every position of ``tokens``: one prefill pass over a scratch cache (one cache
    serves every layer: each layer writes all its keys before it reads them)."""
    from engine.models.layers import AttentionMetadata

    n = len(tokens)
    blocks = -(-n // 16)
    scratch = [torch.zeros(blocks, 16, config.num_kv_heads, config.head_dim, device="cuda", dtype=dtype)
               for _ in range(2)]
    pos = torch.arange(n, device="cuda")
    meta = AttentionMetadata(pos, torch.arange(blocks, dtype=torch.int32, device="cuda")[None],
                             torch.tensor([n], dtype=torch.int32, device="cuda"),
                             torch.tensor([0, n], dtype=torch.int32, device="cuda"))
    ids = torch.tensor(tokens, device="cuda")
    return model.compute_logits(model(ids, pos, [tuple(scratch)] * config.num_layers, meta)).double()


def test_generation_gpu_path_matches_reference_path(llama7b, monkeypatch):
    """bf16 Triton path vs bf16 reference path vs an fp32 copy of the model (reference kernels): the Triton
    path must be as close to fp32 as the reference path is (bf16 rounding through 32 random layers moves the
    logits by a few percent in both), and its argmax may differ from fp32's only at near-ties."""
    import copy

    from engine import SamplingParams

    llm = llama7b
    engine_ = llm.engine
    assert engine_.runner.graphs is not None and engine_.dtype == torch.bfloat16
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 32000, (n,), generator=g).tolist() for n in (7, 129, 300, 513)]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    fast = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]  # decodes through the CUDA graphs
    sequences = [p + f[:-1] for p, f in zip(prompts, fast)]
    cfg = engine_.model_config
    fast_logits = [score(engine_.model, cfg, s, torch.bfloat16) for s in sequences]
    with monkeypatch.context() as mp:
        reference_path(mp, llm)
        slow = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        ref_logits = [score(engine_.model, cfg, s, torch.bfloat16) for s in sequences]
        fp32 = copy.deepcopy(engine_.model).float()
        true_logits = [score(fp32, cfg, s, torch.float32) for s in sequences]
        del fp32
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(fast, slow)]
    print(f"free-running greedy, Triton+graphs vs reference (both bf16): first divergence at {first} of 32")
    flips = positions = 0
    for prompt, f, r, t in zip(prompts, fast_logits, ref_logits, true_logits):
        err_fast, err_ref = rel_err(f, t), rel_err(r, t)
        print(f"prompt {len(prompt)}: logits rel err vs fp32: Triton {err_fast:.4f}, reference {err_ref:.4f}; "
              f"Triton vs reference {rel_err(f, r):.4f}")
        assert err_fast < 1.25 * err_ref + 2e-3 and err_fast < 0.1
        gen = slice(len(prompt) - 1, None)  # positions whose argmax is a generated token
        fg, tg = f[gen], t[gen]
        fa, ta = fg.argmax(-1), tg.argmax(-1)
        positions += len(fa)
        tie = 6 * (fg - tg).pow(2).mean().sqrt().item()  # six standard deviations of the bf16 logit noise
        for i in (fa != ta).nonzero().flatten().tolist():
            flips += 1
            gap = (tg[i, ta[i]] - tg[i, fa[i]]).item()
            assert gap < tie, f"argmax differs from fp32 at a non-tie: top-2 gap {gap:.4f} >= {tie:.4f}"
    print(f"teacher-forced argmax vs fp32: {positions - flips}/{positions} positions agree; every flip a near-tie")


def test_pass_graphs_match_eager_passes(llama7b):
    """Every pass of a staggered workload (decode batches and padded passes with prompt tokens) through its CUDA
    graph and eagerly, both on the Triton path: the sampled rows' logits agree and the graphs cover every pass of
    up to ``max_graph_tokens`` tokens. The two paths round differently (the KV split count follows the block
    table's width, cuBLAS picks kernels by row count), and 32 random bf16 layers amplify that to a few percent,
    as ``test_generation_gpu_path_matches_reference_path`` measures against fp32; a wrong row (bad padding or
    sample row) would be uncorrelated, a relative error near 1.4."""
    from engine import SamplingParams

    engine_ = llama7b.engine
    runner, graphs = engine_.runner, engine_.runner.graphs
    assert graphs.mixed_buckets and graphs.mixed_buckets[-1] == 1024
    g = torch.Generator().manual_seed(1)
    kinds = set()
    for n in (37, 300, 5, 700, 90, 1, 1500):
        engine_.add_request(torch.randint(3, 32000, (n,), generator=g).tolist(),
                            SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        for _ in range(2):
            plan = engine_.scheduler.schedule()
            if plan is None:
                break
            key = graphs.key(plan)
            assert (key is not None) == (plan.num_tokens <= 1024 or plan.num_tokens == plan.num_seqs)
            if key is not None:
                kinds.add((key[0], key[1] > plan.num_tokens))
                with torch.inference_mode():
                    replayed = graphs.run(plan).double()
                    eager = runner.execute_model(runner.prepare_inputs(plan)).double()
                assert replayed.shape == eager.shape
                err = rel_err(replayed, eager)
                print(f"{plan.num_tokens} tokens / {plan.num_seqs} seqs via {key}: rel err {err:.4f}")
                assert err < 0.05, (plan.num_tokens, plan.num_seqs, key)
            engine_.scheduler.update(plan, runner.run(plan))
    while engine_.has_unfinished():
        engine_.step()
    assert ("mixed", True) in kinds, kinds  # padded (decode padding: tests/test_runner.py and the test above)


def test_inputs_staged_through_one_pinned_buffer(llama7b):
    """``ModelRunner.to_device`` reuses one pinned buffer: in and out of inference mode, grown when too small, and
    written again right after an asynchronous copy out of it (which it must wait for)."""
    import numpy as np

    runner = llama7b.engine.runner
    small, large = np.arange(100, dtype=np.int32), np.arange(70_000, dtype=np.int32)[::-1].copy()
    with torch.inference_mode():
        a = runner.to_device(small)
    b = runner.to_device(large)
    c = runner.to_device(small * 3)
    out = torch.zeros(200, dtype=torch.int32, device="cuda")
    d = runner.to_device(small + 7, out=out)
    assert a.tolist() == small.tolist() and b.tolist() == large.tolist() and c.tolist() == (small * 3).tolist()
    assert d.data_ptr() == out.data_ptr() and out[:100].tolist() == (small + 7).tolist() and not out[100:].any()


def test_decode_passes_enqueued_ahead_match_plain_steps(llama7b):
    """On the GPU the pass enqueued ahead reads its input ids from the previous replay's argmax while the host is
    still busy: same plans and, where no request leaves the batch early, bit-identical tokens without it. A late
    arrival discards the pass ahead; an abort uses it in part."""
    from engine import SamplingParams

    engine_ = llama7b.engine
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 32000, (n,), generator=g).tolist() for n in (40, 700, 9, 130, 64)]

    def drive(pipeline: bool, abort: bool):
        engine_.pipeline_decodes = pipeline
        before = dict(engine_.pipeline_stats)
        plans, tokens = [], {}
        for i, p in enumerate(prompts[:4]):
            engine_.add_request(p, SamplingParams(max_tokens=20 + 7 * i, temperature=0, ignore_eos=True),
                                request_id=f"{pipeline}{abort}{i}")
        step = 0
        while engine_.has_unfinished():
            if step == 12:
                engine_.add_request(prompts[4], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
                                    request_id=f"{pipeline}{abort}4")
            if abort and step == 25:
                engine_.abort(f"{pipeline}{abort}2")
            plans.append(engine_.scheduler.running and [r.request_id[-1] for r in engine_.scheduler.running])
            for out in engine_.step():
                tokens[out.request_id[-1]] = out.outputs[0].token_ids
            step += 1
        engine_.pipeline_decodes = True
        return plans, tokens, {k: v - before[k] for k, v in engine_.pipeline_stats.items()}

    plain_plans, plain, _ = drive(False, abort=False)
    piped_plans, piped, stats = drive(True, abort=False)
    assert piped_plans == plain_plans and piped == plain
    assert stats["used"] > 20 and stats["discarded"] >= 1, stats
    plain_plans, plain, _ = drive(False, abort=True)
    piped_plans, piped, stats = drive(True, abort=True)
    assert piped_plans == plain_plans and piped.keys() == plain.keys() and stats["used"] > 20
    assert sum(a == b for k in plain for a, b in zip(plain[k], piped[k])) >= 0.9 * sum(map(len, plain.values()))


def test_pass_trace_times_every_pass_on_the_device(llama7b):
    """``trace_passes(device_time=True)``: every traced pass has its GPU time, passes enqueued ahead too; the
    trace ends when asked."""
    from engine import SamplingParams

    engine_ = llama7b.engine
    records = []
    untrace = engine_.trace_passes(records.append, device_time=True)
    g = torch.Generator().manual_seed(3)
    for n in (30, 200):
        engine_.add_request(torch.randint(3, 32000, (n,), generator=g).tolist(),
                            SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    while engine_.has_unfinished():
        engine_.step()
    untrace()
    traced = len(records)
    engine_.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    while engine_.has_unfinished():
        engine_.step()
    assert len(records) == traced and any(r.ahead for r in records)
    assert all(0 < r.device_s < 1 for r in records), [r.device_s for r in records]


def test_a_closed_engine_gives_its_memory_back():
    import gc

    from engine import LLMEngine, SamplingParams

    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    engine_ = LLMEngine("tiny-llama", device="cuda", dtype="bfloat16", num_kv_blocks=256, max_num_seqs=8,
                        token_budget=64)
    engine_.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    engine_.step()
    assert torch.cuda.memory_allocated() > before
    engine_.close()
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() - before < 1 << 20
    with pytest.raises(RuntimeError, match="closed"):
        engine_.step()
