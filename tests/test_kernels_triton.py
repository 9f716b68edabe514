"""Triton kernels against ``kernels.reference``, run by Triton's CPU interpreter (TRITON_INTERPRET=1).

Triton reads TRITON_INTERPRET when ``@triton.jit`` decorates a function, its own library functions included,
so the variable must be set before triton is first imported. When this file is collected in a process that
has already imported triton without it (``import transformers`` does), the checks run in a fresh child
process instead, through the one test ``test_kernels_in_interpreter_child``. Inputs are fresh random draws
each run and outputs are poisoned with NaN, so an unwritten element fails. bf16 attention is not run here:
the interpreter of triton 3.9 multiplies bf16 ``tl.dot`` operands as their raw uint16 bits; the GPU script
``benchmarks/kernels_gpu.py`` checks bf16 attention at full size.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_IN_PROCESS = "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1"
if _IN_PROCESS:
    os.environ["TRITON_INTERPRET"] = "1"

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402  (a dev dependency: missing triton must fail this file, not skip it)

from kernels import reference as ref  # noqa: E402

_MODULES = ("triton_attention", "triton_norm", "triton_rotary", "triton_activation", "triton_linear")


if not _IN_PROCESS:
    def test_kernels_in_interpreter_child():
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                             cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]


@pytest.fixture(scope="module")
def tk():
    """The Triton kernel modules, decorated by the interpreter."""
    import importlib

    from triton.runtime.interpreter import InterpretedFunction
    mods = {name: importlib.import_module(f"kernels.{name}") for name in _MODULES}
    assert isinstance(mods["triton_norm"]._rms_norm_kernel, InterpretedFunction)
    return mods


@pytest.fixture
def poison(monkeypatch):
    """Make every float tensor the kernels' wrappers allocate start as NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: nan(empty_like(*a, **kw)))


def _rel_err(out: torch.Tensor, expect: torch.Tensor) -> float:
    assert not out.isnan().any(), "NaN in output: an element was not written"
    return ((out.double() - expect.double()).norm() / expect.double().norm()).item()


_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _batch(q_lens, ctxs, heads, kv_heads, head_dim, block_size, dtype):
    """A ragged batch over a paged cache whose blocks are scattered at random, rows padded with valid ids."""
    n_blocks = [triton.cdiv(c, block_size) for c in ctxs]
    num_blocks = sum(n_blocks) + 3
    perm = torch.randperm(num_blocks).tolist()
    width = max(n_blocks) + 1
    tables = torch.randint(0, num_blocks, (len(ctxs), width), dtype=torch.int32)
    used = 0
    for b, n in enumerate(n_blocks):
        tables[b, :n] = torch.tensor(perm[used:used + n], dtype=torch.int32)
        used += n
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    q = torch.randn(sum(q_lens), heads, head_dim).to(dtype)
    qsl = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    return q, k_cache, v_cache, tables, torch.tensor(ctxs, dtype=torch.int32), qsl


def _mixed_lens():
    """Three decodes, a chunk with a cached prefix, and a first chunk, in a random order."""
    decodes = [(1, int(torch.randint(1, 70, ()))) for _ in range(3)]
    chunk = int(torch.randint(2, 20, ()))
    prefixed = (chunk, chunk + int(torch.randint(1, 40, ())))
    first = int(torch.randint(2, 20, ()))
    pairs = [*decodes, prefixed, (first, first)]
    order = torch.randperm(len(pairs)).tolist()
    return [pairs[i][0] for i in order], [pairs[i][1] for i in order]


@pytest.mark.parametrize("dtype,head_dim,block_size,heads,kv_heads", [
    (torch.float32, 64, 16, 4, 2),
    (torch.float32, 128, 32, 4, 4),
    (torch.float16, 128, 16, 8, 2),
    (torch.float32, 80, 16, 3, 1),
])
def test_paged_attention_mixed_batch(tk, poison, dtype, head_dim, block_size, heads, kv_heads):
    ta = tk["triton_attention"]
    q_lens, ctxs = _mixed_lens()
    args = _batch(q_lens, ctxs, heads, kv_heads, head_dim, block_size, dtype)
    scale = head_dim ** -0.5
    expect = ref.paged_attention(*args, scale)
    out = ta.paged_attention(*args, scale)
    assert out.dtype == dtype and out.shape == expect.shape
    assert _rel_err(out, expect) < _TOL[dtype]
    # Decodes and chunks in two launches, each filling only its own rows of one output.
    # Also strided over a work list, as in a CUDA graph: 1-2 programs per KV head here, several tiles each.
    block_m = max(16, triton.next_power_of_2(heads // kv_heads))
    for strided in (0, 2):
        both = torch.full_like(expect, float("nan"))
        for kind in (1, 2):
            cfg = ta.AttentionConfig(block_m, 32, 4, 1, qlen_filter=kind, strided_per_sm=strided)
            ta.paged_attention_with(*args, scale, cfg, out=both)
        assert _rel_err(both, expect) < _TOL[dtype]


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (128, 64)])
def test_paged_attention_long_chunks(tk, poison, block_m, block_n):
    """Chunks spanning several query and KV tiles: unmasked tiles before the diagonal, masked ones on it."""
    ta = tk["triton_attention"]
    chunk, prefix, first = (int(x) for x in torch.randint(20, 90, (3,)))
    q_lens, ctxs = [chunk, 1, first], [prefix + chunk, int(torch.randint(1, 120, ())), first]
    args = _batch(q_lens, ctxs, 4, 2, 64, 16, torch.float32)
    expect = ref.paged_attention(*args, 0.125)
    out = ta.paged_attention_with(*args, 0.125, ta.AttentionConfig(block_m, block_n, 4, 1))
    assert _rel_err(out, expect) < _TOL[torch.float32]


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("strided", [0, 4])
def test_paged_attention_padded_like_a_graph(tk, poison, strided, graph):
    """A mixed CUDA graph's layout: trailing padding tokens of no sequence and empty padding sequences. Strided,
    the launches get 2 programs per KV head (one "SM" off CUDA), so each program takes several tiles; ``graph``:
    the configs chosen for a graph capture (one launch over decodes and chunks), else the eager ones."""
    ta = tk["triton_attention"]
    chunk, prefix = (int(x) for x in torch.randint(40, 90, (2,)))
    q_lens = [1, 1, 1, chunk, 17, 0, 0, 0]
    ctxs = [int(c) for c in torch.randint(1, 100, (3,))] + [prefix + chunk, 17, 1, 1, 1]
    q, k_cache, v_cache, tables, ctx, qsl = _batch(q_lens, ctxs, 4, 2, 64, 16, torch.float32)
    padded = torch.cat([q, torch.randn(5, 4, 64)])  # rows of no sequence: never read back
    expect = ref.paged_attention(q, k_cache, v_cache, tables, ctx, qsl, 0.125)
    configs = ta.default_config(padded, k_cache, tables, ctx, strided=graph)
    assert [c.qlen_filter for c in configs] == [1, 2]
    assert all(bool(c.strided_per_sm) == graph for c in configs)
    out = None
    for cfg in configs:
        cfg = ta.dataclasses.replace(cfg, block_m=16, block_n=32, strided_per_sm=strided)
        out = ta.paged_attention_with(padded, k_cache, v_cache, tables, ctx, qsl, 0.125, cfg, out=out)
    assert _rel_err(out[:q.shape[0]], expect) < _TOL[torch.float32]


@pytest.mark.parametrize("dtype,head_dim,splits,min_tiles", [
    (torch.float32, 128, 3, 1), (torch.float16, 64, 4, 1), (torch.float32, 64, 4, 2), (torch.float32, 64, 2, 3)])
def test_paged_attention_decode_split(tk, poison, dtype, head_dim, splits, min_tiles):
    """A KV split; with ``min_split_tiles`` a short context fills fewer splits (here contexts of 1 to 6 tiles of
    32, so some leave every split but the first empty, some fill all of them)."""
    ta = tk["triton_attention"]
    ctxs = [int(c) for c in torch.randint(1, 150, (3,))] + [int(torch.randint(1, 32, ())), 160, 192]
    args = _batch([1] * len(ctxs), ctxs, 8, 2, head_dim, 16, dtype)
    expect = ref.paged_attention(*args, 0.1)
    cfg = ta.AttentionConfig(16, 32, 4, 1, num_splits=splits, min_split_tiles=min_tiles)
    out = ta.paged_attention_with(*args, 0.1, cfg)
    assert _rel_err(out, expect) < _TOL[dtype]
    (cfg,) = ta.default_config(args[0], args[1], args[3], args[4])  # a CPU tensor counts one SM: no split
    assert cfg.num_splits == 1 and cfg.block_m == 16


def test_decode_split_rule(tk, monkeypatch):
    """Fewer (sequence, KV head) programs than SMs: split toward 4 per SM. 1-2 per SM: two splits of at least
    ``LONG_SPLIT_MIN_TILES`` tiles, when the block table can hold that many. More: no split. Chunks: never."""
    ta = tk["triton_attention"]
    monkeypatch.setattr(ta, "_sm_count", lambda device: 8)
    kc = torch.empty(4, 16, 2, 64)

    def config(seqs, width, tokens=None):
        q = torch.empty(tokens or seqs, 4, 64)
        return ta.default_config(q, kc, torch.empty(seqs, width, dtype=torch.int32),
                                 torch.empty(seqs, dtype=torch.int32))

    (small,) = config(2, 256)  # 4 programs
    assert small.num_splits == 8 and small.min_split_tiles == 1 and small.num_stages == 1
    (long,) = config(5, 2 * ta.LONG_SPLIT_MIN_TILES * 4)  # 10 programs; the table holds 2 x min tiles of 64
    assert (long.num_splits, long.min_split_tiles, long.num_stages) == (2, ta.LONG_SPLIT_MIN_TILES, 2)
    (short,) = config(5, 2 * ta.LONG_SPLIT_MIN_TILES * 4 - 4)  # one 64-token tile less
    assert short.num_splits == 1
    (many,) = config(8, 4096)  # 16 programs
    assert many.num_splits == 1 and many.num_stages == 2
    assert all(c.num_splits == 1 for c in config(5, 4096, tokens=20))


def test_mixed_launches_follow_the_kernel_options(tk):
    """A mixed batch's two launches take their decode tile, overlap and programs per SM from the kernel options in
    force, and go back to the defaults after."""
    import kernels
    ta = tk["triton_attention"]
    kc = torch.empty(4, 16, 2, 64)

    def launches():  # 5 sequences, 20 tokens: a mixed batch, as in a graph
        return ta.default_config(torch.empty(20, 4, 64), kc, torch.empty(5, 64, dtype=torch.int32),
                                 torch.empty(5, dtype=torch.int32), strided=True)

    default, options = launches(), kernels.kernel_options()
    assert (default[0].block_n, default[0].num_warps, default[0].num_stages) == options.mixed_decode
    assert default[1].overlap == options.overlap_chunks
    assert {c.strided_per_sm for c in default} == {options.graph_programs_per_sm}
    with kernels.use_kernel_options(mixed_decode=(64, 8, 3), overlap_chunks=False, graph_programs_per_sm=3):
        decodes, chunks = launches()
    assert (decodes.block_n, decodes.num_warps, decodes.num_stages) == (64, 8, 3) and not chunks.overlap
    assert {decodes.strided_per_sm, chunks.strided_per_sm} == {3}
    assert launches() == default


def test_min_split_tiles_needs_decodes(tk):
    ta = tk["triton_attention"]
    args = _batch([3, 1], [40, 70], 4, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="decode-only"):
        ta.paged_attention_with(*args, 1.0, ta.AttentionConfig(16, 32, 4, 1, num_splits=2, min_split_tiles=2))


@pytest.mark.parametrize("splits", [2, 3])
def test_paged_attention_first_tile_before_the_wait(tk, poison, monkeypatch, splits):
    """Launched with PDL and a KV split, a program loads its first KV tile before waiting for the previous kernel
    when that tile holds only keys cached by earlier passes, and loads nothing then otherwise. Run here without
    the wait (the interpreter runs no PTX): contexts ending inside, at the end of and past the first KV tiles,
    and a chunk with a cached prefix."""
    ta = tk["triton_attention"]
    monkeypatch.setattr(ta, "launch_kwargs", lambda pdl: {"USE_PDL": False})
    chunk, prefix = (int(x) for x in torch.randint(20, 70, (2,)))
    ctxs = [1, 31, 32, 33, 64, 65, int(torch.randint(66, 150, ())), prefix + chunk]
    q_lens = [1] * 7 + [chunk]
    args = _batch(q_lens, ctxs, 4, 2, 64, 16, torch.float32)
    expect = ref.paged_attention(*args, 0.125)
    out = ta.paged_attention_with(*args, 0.125, ta.AttentionConfig(16, 32, 4, 1, num_splits=splits), pdl=True)
    assert _rel_err(out, expect) < _TOL[torch.float32]


def test_chunk_launch_beside_the_decode_launch(tk, poison, monkeypatch):
    """A mixed batch as in a graph with PDL: the chunks' launch overlaps the decodes' (waits only at its end). Run
    without the waits (the interpreter runs no PTX): each launch still fills exactly its own rows."""
    ta = tk["triton_attention"]
    monkeypatch.setattr(ta, "launch_kwargs", lambda pdl: {"USE_PDL": False})
    chunk = int(torch.randint(20, 70, ()))
    q_lens, ctxs = [1, 1, 1, chunk], [int(c) for c in torch.randint(1, 100, (3,))] + [chunk + 30]
    args = _batch(q_lens, ctxs, 4, 2, 64, 16, torch.float32)
    expect = ref.paged_attention(*args, 0.125)
    configs = ta.default_config(args[0], args[1], args[3], args[4], strided=True)
    assert [c.overlap for c in configs] == [False, ta.kernel_options().overlap_chunks]
    out = None
    for cfg in configs:
        cfg = ta.dataclasses.replace(cfg, block_m=16, block_n=32, strided_per_sm=2, overlap=cfg.qlen_filter == 2)
        out = ta.paged_attention_with(*args, 0.125, cfg, out=out, pdl=True)
    assert _rel_err(out, expect) < _TOL[torch.float32]


def test_attention_rejects_bad_shapes(tk):
    ta = tk["triton_attention"]
    args = list(_batch([1], [5], 4, 2, 72, 16, torch.float32))
    with pytest.raises(ValueError, match="head_dim 72"):
        ta.paged_attention(*args, 1.0)
    args = list(_batch([1], [5], 3, 2, 64, 16, torch.float32))
    with pytest.raises(ValueError, match="num_heads 3"):
        ta.paged_attention(*args, 1.0)
    args = list(_batch([1], [5], 4, 2, 64, 16, torch.float32))
    with pytest.raises(ValueError, match="strided_per_sm"):
        ta.paged_attention_with(*args, 1.0, ta.AttentionConfig(16, 32, 4, 1, num_splits=2, strided_per_sm=2))


@pytest.mark.parametrize("dtype,head_dim,block_size", [
    (torch.float32, 64, 16), (torch.bfloat16, 128, 32), (torch.float16, 64, 32)])
def test_write_kv(tk, dtype, head_dim, block_size):
    num_blocks, kv_heads, tokens = 5, 2, 9
    k = torch.randn(tokens, kv_heads, head_dim).to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim).to(dtype)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[torch.randperm(tokens)[:2]] = -1
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn_like(k_cache)
    k_expect, v_expect = k_cache.clone(), v_cache.clone()
    ref.write_kv(k, v, k_expect, v_expect, slots)
    tk["triton_attention"].write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_expect) and torch.equal(v_cache, v_expect)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm(tk, poison, dtype, with_residual):
    x = torch.randn(5, 96).to(dtype)
    residual = torch.randn(5, 96).to(dtype) if with_residual else None
    weight = (1 + 0.1 * torch.randn(96)).to(dtype)
    out, res = tk["triton_norm"].rms_norm(x, weight, 1e-6, residual)
    out_ref, res_ref = ref.rms_norm(x, weight, 1e-6, residual)
    assert out.dtype == out_ref.dtype and res.dtype == res_ref.dtype
    assert _rel_err(out, out_ref) < _TOL[dtype]
    if dtype == torch.bfloat16:  # the interpreter rounds fp32 -> bf16 toward zero, the GPU to nearest
        torch.testing.assert_close(res, res_ref, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(res, res_ref)


@pytest.mark.parametrize("dtype,head_dim", [(torch.float32, 64), (torch.bfloat16, 128), (torch.float16, 128)])
def test_rotary_embedding(tk, poison, dtype, head_dim):
    tokens, max_pos = 7, 64
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    q = torch.randn(tokens, 4, head_dim).to(dtype)
    k = torch.randn(tokens, 2, head_dim).to(dtype)
    positions = torch.randint(0, max_pos, (tokens,))
    q_out, k_out = tk["triton_rotary"].rotary_embedding(q, k, positions, cache)
    q_ref, k_ref = ref.rotary_embedding(q, k, positions, cache)
    assert _rel_err(q_out, q_ref) < _TOL[dtype] and _rel_err(k_out, k_ref) < _TOL[dtype]
    with pytest.raises(ValueError, match="head_dim"):
        tk["triton_rotary"].rotary_embedding(q, k, positions, cache[:, :-2])


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim", [(torch.float32, 4, 2, 64), (torch.bfloat16, 3, 3, 80),
                                                          (torch.float16, 8, 1, 128)])
def test_rotary_embedding_and_write_kv(tk, poison, dtype, heads, kv_heads, head_dim):
    """Rotation and the cache write in one launch, against the two references; slot -1 writes nothing."""
    tokens, block_size, num_blocks = 7, 16, 4
    q, k, v = (torch.randn(tokens, h, head_dim).to(dtype) for h in (heads, kv_heads, kv_heads))
    positions = torch.randint(0, 50, (tokens,))
    ang = torch.outer(torch.arange(64).float(), 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)))
    cos_sin = torch.cat((ang.cos(), ang.sin()), -1)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[int(torch.randint(0, tokens, ()))] = -1
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn_like(k_cache)
    k_expect, v_expect = k_cache.clone(), v_cache.clone()
    q_expect, k_rot = ref.rotary_embedding(q, k, positions, cos_sin)
    ref.write_kv(k_rot, v, k_expect, v_expect, slots)
    out = tk["triton_rotary"].rotary_embedding_and_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots)
    assert out.shape == q.shape and _rel_err(out, q_expect) < _TOL[dtype]
    assert _rel_err(k_cache, k_expect) < _TOL[dtype] and torch.equal(v_cache, v_expect)


def test_rotary_embedding_and_write_kv_dispatch():
    """On the CPU, and with the kernel option ``fused_rotary`` off, the two references run in turn."""
    import kernels
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    cos_sin, positions, slots = torch.randn(10, 8), torch.tensor([1, 5, 9]), torch.tensor([0, -1, 6])
    caches = [torch.zeros(2, 4, 2, 8) for _ in range(4)]
    q_expect, k_rot = ref.rotary_embedding(q, k, positions, cos_sin)
    ref.write_kv(k_rot, v, caches[0], caches[1], slots)
    for fused in (True, False):
        with kernels.use_kernel_options(fused_rotary=fused):
            kc, vc = (c.zero_() for c in caches[2:])
            assert torch.equal(kernels.rotary_embedding_and_write_kv(q, k, v, positions, cos_sin, kc, vc, slots),
                               q_expect)
        assert torch.equal(kc, caches[0]) and torch.equal(vc, caches[1])


@pytest.mark.parametrize("dtype,width", [(torch.float32, 96), (torch.bfloat16, 2 * 1100), (torch.float16, 64)])
def test_silu_and_mul(tk, poison, dtype, width):
    x = torch.randn(5, width).to(dtype)
    out = tk["triton_activation"].silu_and_mul(x)
    expect = ref.silu_and_mul(x)
    assert out.shape == (5, width // 2) and out.dtype == dtype
    assert _rel_err(out, expect) < _TOL[dtype]


# bf16 only through the one-row path: the interpreter's bf16 tl.dot is wrong (see the module docstring)
@pytest.mark.parametrize("rows,dtype,block_m", [(1, torch.bfloat16, 1), (1, torch.float16, 1), (1, torch.float32, 1),
                                                (3, torch.float16, 1), (5, torch.float32, 16),
                                                (19, torch.float16, 16)])
@pytest.mark.parametrize("n,k,bias", [(64, 256, False), (72, 200, True)])
def test_linear(tk, poison, rows, dtype, block_m, n, k, bias):
    x = torch.randn(rows, k).to(dtype)
    w = (torch.randn(n, k) / k ** 0.5).to(dtype)
    b = torch.randn(n).to(dtype) if bias else None
    cfg = tk["triton_linear"].LinearConfig(block_m, 16, 64, 4, 2)
    out = tk["triton_linear"].linear_with(x, w, b, cfg)
    assert out.shape == (rows, n) and out.dtype == dtype
    assert _rel_err(out, ref.linear(x.float(), w.float(), None if b is None else b.float())) < _TOL[dtype]


@pytest.mark.parametrize("rows,dtype,block_m,block_n", [(1, torch.bfloat16, 1, 8), (1, torch.float32, 1, 16),
                                                        (3, torch.float16, 1, 8), (5, torch.float32, 16, 32)])
@pytest.mark.parametrize("inter,k,bias", [(64, 256, False), (36, 200, True)])
def test_linear_silu_and_mul(tk, poison, rows, dtype, block_m, block_n, inter, k, bias):
    """A merged gate/up projection with the activation in the kernel's epilogue, against the product then
    ``silu_and_mul``; a width (36) that leaves a program's tile part empty."""
    x = torch.randn(rows, k).to(dtype)
    w = (torch.randn(2 * inter, k) / k ** 0.5).to(dtype)
    b = torch.randn(2 * inter).to(dtype) if bias else None
    cfg = tk["triton_linear"].LinearConfig(block_m, block_n, 64, 4, 2)
    out = tk["triton_linear"].linear_with(x, w, b, cfg, gated=True)
    assert out.shape == (rows, inter) and out.dtype == dtype
    expect = ref.linear_silu_and_mul(x.float(), w.float(), None if b is None else b.float())
    assert _rel_err(out, expect) < _TOL[dtype]
    with pytest.raises(ValueError, match="even number"):
        tk["triton_linear"].linear_with(x, w[1:], None, cfg, gated=True)


def test_linear_dispatch_and_errors(tk, monkeypatch):
    lin = tk["triton_linear"]
    x = torch.randn(2, 3, 32)
    w = torch.randn(48, 32)
    calls, kernel = [], lin.linear_with
    monkeypatch.setattr(lin, "linear_with", lambda *a: calls.append(a[3]) or kernel(*a))
    out = lin.linear(x.half(), w.half())  # [2, 3, 32]: six rows through the kernel, shape kept
    assert out.shape == (2, 3, 48) and _rel_err(out, ref.linear(x, w)) < _TOL[torch.float16]
    assert calls == [lin.default_config(6, 48, 32)]
    lin.linear(torch.randn(17, 32).half(), w.half())  # past MAX_ROWS: cuBLAS
    assert len(calls) == 1
    with pytest.raises(ValueError, match="expected x"):
        kernel(x, w[:, :16], None, lin.default_config(6, 48, 32))
    with pytest.raises(ValueError, match="dtypes"):
        kernel(x, w.half(), None, lin.default_config(6, 48, 32))
    with pytest.raises(ValueError, match="block_m"):
        kernel(x, w, None, lin.LinearConfig(8, 16, 32, 4, 2))


def test_linear_dispatch_only_within_graph_kernels(tk, monkeypatch):
    """``kernels.linear`` runs the Triton kernel only inside ``graph_kernels()`` (the graph capture)."""
    import kernels
    seen = []
    monkeypatch.setattr(kernels, "_impl", lambda module, x: seen.append(module) or ref)
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    kernels.linear(x, w)
    with kernels.graph_kernels():
        kernels.linear(x, w)
        with kernels.graph_kernels():
            pass
        kernels.linear(x, w)  # still inside after a nested block ends
    kernels.linear(x, w)
    assert seen == ["triton_linear", "triton_linear"]

    # the gate/up projection with its activation: the fused kernel only inside
    from types import SimpleNamespace
    fused = SimpleNamespace(linear_silu_and_mul=lambda *a, **kw: seen.append("fused") or ref.linear_silu_and_mul(*a))
    monkeypatch.setattr(kernels, "_impl", lambda module, x: fused if module == "triton_linear" else ref)
    seen.clear()
    w2 = torch.randn(10, 8)
    out = kernels.linear_silu_and_mul(x, w2)
    with kernels.graph_kernels():
        inside = kernels.linear_silu_and_mul(x, w2)
    assert seen == ["fused"] and torch.allclose(out, ref.linear_silu_and_mul(x, w2)) and torch.allclose(inside, out)


def test_attention_dispatch_strides_within_graph_kernels(monkeypatch):
    """Inside ``graph_kernels()`` the Triton attention gets ``strided=True`` (the CUDA graphs' launch shape)."""
    import types

    import kernels
    calls = []
    fake = types.SimpleNamespace(paged_attention=lambda *a, strided, pdl: calls.append((strided, pdl)))
    monkeypatch.setattr(kernels, "_impl", lambda module, x: fake)
    args = [torch.zeros(1)] * 6 + [1.0]
    kernels.paged_attention(*args)
    with kernels.graph_kernels():
        kernels.paged_attention(*args)
    assert calls == [(False, False), (True, False)]  # no PDL off CUDA


def test_pdl_only_within_graph_kernels_on_hopper(monkeypatch):
    """Triton kernels launch with PDL inside ``graph_kernels()`` on a CUDA device of compute capability 9+,
    unless SPLITFUSE_PDL=0 turned it off."""
    import types

    import kernels
    cuda = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    capable = {0: True}
    monkeypatch.setattr(kernels, "_pdl_capable", lambda index: capable[index])
    assert not kernels._pdl(cuda)
    with kernels.graph_kernels():
        assert kernels._pdl(cuda)
        assert not kernels._pdl(torch.zeros(1))
        capable[0] = False
        assert not kernels._pdl(cuda)
        capable[0] = True
        with kernels.use_kernel_options(pdl=False):
            assert not kernels._pdl(cuda)
        assert kernels._pdl(cuda)


def test_dispatch_uses_reference_off_cuda():
    import kernels
    x = torch.randn(3, 16)
    assert kernels._impl("triton_norm", x) is ref
    out, res = kernels.rms_norm(x, torch.ones(16), 1e-6)
    assert torch.equal(out, ref.rms_norm(x, torch.ones(16), 1e-6)[0]) and res is x


if not _IN_PROCESS:  # triton was imported un-interpreted here: the child process runs these instead
    for _name in [n for n in globals() if n.startswith("test_") and n != "test_kernels_in_interpreter_child"]:
        del globals()[_name]
