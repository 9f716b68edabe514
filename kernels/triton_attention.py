"""Triton paged attention over a ragged mixed batch, and the paged KV-cache write.

Same functions and contracts as ``kernels/reference.py``. One kernel serves prompt chunks and decodes of a
ragged batch (``paged_attention`` launches it twice for a mixed batch, decodes then chunks, as measured
faster): each program takes one KV head and a tile of BLOCK_M rows made of BLOCK_Q query tokens times
the GROUP query heads that share that KV head, so a decode of a GQA model still feeds the tensor cores, and
a K/V tile read once serves the whole group. KV tiles of BLOCK_N tokens are gathered through the block
table and folded in with an online softmax (flash attention), accumulating in fp32. When the batch is all
decodes and too small to fill the GPU, the KV range is split over several programs (flash decoding) and a
second kernel merges the partial results; at one to two programs per SM only long contexts split, in two.
Captured in a CUDA graph, each launch of a mixed batch has a bounded grid whose programs stride over a work list
of its tiles, so the graph's padding sequences cost no programs, and the chunks' launch runs beside the decodes'.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from kernels.options import kernel_options
from kernels.triton_pdl import launch_kwargs, launch_next, wait_for_previous, wait_only

_LOG2E = 1.4426950408889634
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     num_kv_heads, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_previous(USE_PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // BLOCK_SIZE
        off = slot % BLOCK_SIZE
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < num_kv_heads) & (d < HEAD_DIM)
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
        tl.store(kc_ptr + blk * stride_kcb + off * stride_kcs + h * stride_kch + d,
                 k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + blk * stride_vcb + off * stride_vcs + h * stride_vch + d,
                 v.to(vc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _find_seq(qsl_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
    # Sequence b owns programs from qsl[b] // BLOCK_Q + b on: at least cdiv(q_len, BLOCK_Q) of them, with no
    # host sync to count them. Binary search for the last b whose first program is <= pid.
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if first <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_tile(t, kv_end, bt_row, kc_ptr, vc_ptr, kvh, offs_n, offs_d, d_ok, stride_kb, stride_ks, stride_kh,
               stride_vb, stride_vs, stride_vh, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
               EVEN_D: tl.constexpr, MASKED: tl.constexpr):
    # Keys and values of KV tile t, gathered through the block table; MASKED: only positions below kv_end.
    n = t * BLOCK_N + offs_n
    if MASKED:
        n_ok = n < kv_end
        blk = tl.load(bt_row + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
    else:
        blk = tl.load(bt_row + n // BLOCK_SIZE).to(tl.int64)
        kv_mask = d_ok[None, :]
    slot = n % BLOCK_SIZE
    k_off = blk[:, None] * stride_kb + slot[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :]
    v_off = blk[:, None] * stride_vb + slot[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :]
    if EVEN_D and not MASKED:
        k = tl.load(kc_ptr + k_off)
        v = tl.load(vc_ptr + v_off)
    else:
        k = tl.load(kc_ptr + k_off, mask=kv_mask, other=0.0)
        v = tl.load(vc_ptr + v_off, mask=kv_mask, other=0.0)
    return k, v, n


@triton.jit
def _fold_tile(acc, m_i, l_i, q, k, v, keep, qk_scale, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    # One KV tile folded into (acc, m_i, l_i) with an online softmax; MASKED: only where ``keep``.
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if MASKED:
        qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_tiles(acc, m_i, l_i, q, q_pos, t_lo, t_hi, kv_end, bt_row, kc_ptr, vc_ptr, kvh, offs_n, offs_d, d_ok,
                  qk_scale, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                  BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
                  PRECISION: tl.constexpr):
    # KV tiles t_lo .. t_hi-1 folded in. Unmasked tiles lie wholly before every query of the tile (no causal or
    # length mask, no masked loads); only the last few are masked.
    for t in range(t_lo, t_hi):
        k, v, n = _load_tile(t, kv_end, bt_row, kc_ptr, vc_ptr, kvh, offs_n, offs_d, d_ok, stride_kb, stride_ks,
                             stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_N, BLOCK_SIZE, EVEN_D, MASKED)
        keep = (n[None, :] <= q_pos[:, None]) & (n < kv_end)[None, :]
        acc, m_i, l_i = _fold_tile(acc, m_i, l_i, q, k, v, keep, qk_scale, MASKED, PRECISION)
    return acc, m_i, l_i


@triton.jit
def _attend_item(q_ptr, kc_ptr, vc_ptr, out_ptr, bt_ptr, ctx_ptr, qsl_ptr, pacc_ptr, pm_ptr, pl_ptr,
                 seq, qb, kvh, split, qk_scale, num_tokens, num_heads, stride_qt, stride_qh, stride_ot, stride_oh,
                 stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr,
                 MIN_SPLIT_TILES: tl.constexpr, PRECISION: tl.constexpr, EARLY: tl.constexpr,
                 USE_PDL: tl.constexpr):
    # Query tile qb of sequence seq (BLOCK_Q tokens x the GROUP heads of KV head kvh) over its causal KV range.
    # EARLY: the kernel has not waited for the previous one yet (PDL); this waits once the first KV tile is loaded,
    # if that tile holds only keys cached by earlier passes (no kernel of this pass writes them). Only a split
    # launch (one or few tiles per program) gains by it; whole contexts per program lost (benchmarks/RESULTS.md,
    # design decisions).
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    ctx = tl.load(ctx_ptr + seq)
    offs_m = tl.arange(0, BLOCK_M)
    tok = qb * BLOCK_Q + offs_m // GROUP
    head = kvh * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
    q_pos = ctx - q_len + tok
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    # Causal: this tile needs keys up to the position of its last query; tiles wholly at or before its
    # first query's position need no mask.
    kv_end = ctx - q_len + tl.minimum(qb * BLOCK_Q + BLOCK_Q, q_len)
    n_tiles = tl.cdiv(kv_end, BLOCK_N)
    if NUM_SPLITS == 1:
        t_lo = 0
        t_hi = n_tiles
    else:
        # A split of fewer than MIN_SPLIT_TILES tiles is not worth its partials: a short context leaves the later
        # splits empty (with MIN_SPLIT_TILES > 1 they store nothing and the merge skips them; see _merge_splits_kernel).
        per_split = tl.maximum(tl.cdiv(n_tiles, NUM_SPLITS), MIN_SPLIT_TILES)
        t_lo = split * per_split
        t_hi = tl.minimum(t_lo + per_split, n_tiles)
    t_full = tl.minimum(tl.maximum((ctx - q_len + qb * BLOCK_Q + 1) // BLOCK_N, t_lo), t_hi)

    # A finite start keeps exp2(m_old - m_new) defined for rows that have seen only masked keys.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    if EARLY:
        early = t_lo < tl.minimum(t_full, (ctx - q_len) // BLOCK_N)  # tile t_lo is whole and cached before
        k, v, n = _load_tile(t_lo, tl.where(early, kv_end, 0), bt_row, kc_ptr, vc_ptr, kvh, offs_n, offs_d, d_ok,
                             stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_N, BLOCK_SIZE,
                             HEAD_DIM == BLOCK_D, True)
        wait_for_previous(USE_PDL)
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if EARLY:  # all keys masked off when the tile was not loaded: folding it changes nothing
        acc, m_i, l_i = _fold_tile(acc, m_i, l_i, q, k, v, (early & (n < kv_end))[None, :], qk_scale, True,
                                   PRECISION)
        t_lo += early.to(tl.int32)
        t_full = tl.maximum(t_full, t_lo)
    acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, q_pos, t_lo, t_full, kv_end, bt_row, kc_ptr, vc_ptr, kvh,
                                  offs_n, offs_d, d_ok, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
                                  stride_vs, stride_vh, BLOCK_N, BLOCK_SIZE, HEAD_DIM == BLOCK_D, False, PRECISION)
    acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, q_pos, t_full, t_hi, kv_end, bt_row, kc_ptr, vc_ptr, kvh,
                                  offs_n, offs_d, d_ok, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
                                  stride_vs, stride_vh, BLOCK_N, BLOCK_SIZE, HEAD_DIM == BLOCK_D, True, PRECISION)

    mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(out_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        if MIN_SPLIT_TILES > 1:  # an empty split stores nothing
            row_ok = row_ok & (offs_m * 0 + t_lo < n_tiles)
            mask = row_ok[:, None] & d_ok[None, :]
        row = (split * num_tokens + q_start + tok).to(tl.int64) * num_heads + head
        tl.store(pacc_ptr + row[:, None] * BLOCK_D + offs_d[None, :], acc, mask=mask)
        tl.store(pm_ptr + row, m_i, mask=row_ok)
        tl.store(pl_ptr + row, l_i, mask=row_ok)


@triton.jit
def _work_tiles(qsl_ptr, num_seqs, QLEN_FILTER: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr):
    # Query tiles per sequence of one launch's kind (0: all, 1: decodes, 2: the rest) and their running total:
    # sequence b's tiles are work items ends[b] - tiles[b] .. ends[b] - 1.
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_seqs
    lens = tl.load(qsl_ptr + s + 1, mask=s_ok, other=0) - tl.load(qsl_ptr + s, mask=s_ok, other=0)
    if QLEN_FILTER == 1:
        tiles = (lens == 1).to(tl.int32)
    elif QLEN_FILTER == 2:
        tiles = tl.where(lens >= 2, (lens + BLOCK_Q - 1) // BLOCK_Q, 0)
    else:
        tiles = (lens + BLOCK_Q - 1) // BLOCK_Q
    return s, tiles, tl.cumsum(tiles, 0)


# Arguments that change from pass to pass are not specialized on (== 1, divisible by 16): each new class would be a
# new compiled variant, mid-run.
@triton.jit(do_not_specialize=["num_seqs", "num_tokens", "stride_bt"])
def _attention_kernel(q_ptr, kc_ptr, vc_ptr, out_ptr, bt_ptr, ctx_ptr, qsl_ptr, pacc_ptr, pm_ptr, pl_ptr,
                      qk_scale, num_seqs, num_tokens, num_heads,
                      stride_qt, stride_qh, stride_ot, stride_oh,
                      stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr, MIN_SPLIT_TILES: tl.constexpr,
                      QLEN_FILTER: tl.constexpr,
                      STRIDED: tl.constexpr, BLOCK_S: tl.constexpr, PRECISION: tl.constexpr,
                      EARLY: tl.constexpr, OVERLAP: tl.constexpr, USE_PDL: tl.constexpr):
    if OVERLAP:
        # The previous kernel is this pass's other attention launch: it writes other rows of out, and each of its
        # programs let this one launch only after waiting for the kernels that wrote q and the cache. So run beside
        # it, and wait for it only before finishing (kernels after this one read its rows too).
        launch_next(USE_PDL)
    elif not EARLY:  # else each program waits once it has loaded its first KV tile (``_attend_item``)
        wait_for_previous(USE_PDL)
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if STRIDED:
        # A work list of this launch's tiles that the programs stride over: a CUDA graph's grid is sized for its
        # bucket's padding (empty sequences), which then costs no programs.
        n_work = tl.sum(_work_tiles(qsl_ptr, num_seqs, QLEN_FILTER, BLOCK_Q, BLOCK_S)[1], 0)
        for w in range(pid, n_work, tl.num_programs(0)):
            # recomputed per tile rather than held live across the attention loops
            s, tiles, ends = _work_tiles(qsl_ptr, num_seqs, QLEN_FILTER, BLOCK_Q, BLOCK_S)
            before = ends <= w
            seq = tl.sum(before.to(tl.int32), 0)
            qb = w - tl.max(tl.where(before, ends, 0), 0)
            n_qb = tl.sum(tl.where(s == seq, tiles, 0), 0)
            _attend_item(q_ptr, kc_ptr, vc_ptr, out_ptr, bt_ptr, ctx_ptr, qsl_ptr, pacc_ptr, pm_ptr, pl_ptr, seq,
                         n_qb - 1 - qb, kvh, split, qk_scale, num_tokens, num_heads, stride_qt,
                         stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                         stride_vh, stride_bt, HEAD_DIM, BLOCK_D, GROUP, BLOCK_M, BLOCK_Q, BLOCK_N, BLOCK_SIZE,
                         NUM_SPLITS, MIN_SPLIT_TILES, PRECISION, False, USE_PDL)
    else:  # one query tile per program
        if QLEN_FILTER == 1:  # one program per sequence: a decode has one query
            seq = pid
            q_len = tl.load(qsl_ptr + seq + 1) - tl.load(qsl_ptr + seq)
            qb = 0
            run = q_len == 1
        else:
            seq = _find_seq(qsl_ptr, pid, num_seqs, BLOCK_Q)
            q_start = tl.load(qsl_ptr + seq)
            q_len = tl.load(qsl_ptr + seq + 1) - q_start
            qb = pid - (q_start // BLOCK_Q + seq)
            n_qb = tl.cdiv(q_len, BLOCK_Q)
            run = qb < n_qb
            qb = n_qb - 1 - qb  # a sequence's last query tiles (the most keys) start first: a shorter tail
            if QLEN_FILTER == 2:  # everything but decodes
                run = run & (q_len != 1)
        if run:
            _attend_item(q_ptr, kc_ptr, vc_ptr, out_ptr, bt_ptr, ctx_ptr, qsl_ptr, pacc_ptr, pm_ptr, pl_ptr, seq,
                         qb, kvh, split, qk_scale, num_tokens, num_heads, stride_qt, stride_qh,
                         stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                         stride_bt, HEAD_DIM, BLOCK_D, GROUP, BLOCK_M, BLOCK_Q, BLOCK_N, BLOCK_SIZE, NUM_SPLITS,
                         MIN_SPLIT_TILES, PRECISION, EARLY, USE_PDL)
        elif EARLY:  # a program without work waits too: kernels after this one count on all before it being done
            wait_for_previous(USE_PDL)
    if OVERLAP:
        wait_only(USE_PDL)


@triton.jit(do_not_specialize=["num_tokens"])
def _merge_splits_kernel(out_ptr, pacc_ptr, pm_ptr, pl_ptr, ctx_ptr, num_tokens, num_heads, stride_ot, stride_oh,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         MIN_SPLIT_TILES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
                         USE_PDL: tl.constexpr):
    wait_for_previous(USE_PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    if MIN_SPLIT_TILES > 1:  # decodes only (token t is sequence t): the splits its context filled
        n_tiles = tl.cdiv(tl.load(ctx_ptr + t), BLOCK_N)
        s_ok = s < tl.cdiv(n_tiles, tl.maximum(tl.cdiv(n_tiles, NUM_SPLITS), MIN_SPLIT_TILES))
    else:
        s_ok = s < NUM_SPLITS
    row = (s * num_tokens + t).to(tl.int64) * num_heads + h
    m = tl.load(pm_ptr + row, mask=s_ok, other=-1.0e30)
    l_s = tl.load(pl_ptr + row, mask=s_ok, other=0.0)
    w = tl.exp2(m - tl.max(m, 0))
    d = tl.arange(0, BLOCK_D)
    acc = tl.load(pacc_ptr + row[:, None] * BLOCK_D + d[None, :], mask=s_ok[:, None] & (d[None, :] < HEAD_DIM),
                  other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l_s * w, 0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Launch shape of ``_attention_kernel``; ``qlen_filter`` 0 = all sequences, 1 = decodes, 2 = the rest.
    ``strided_per_sm`` > 0: at most that many programs per SM, striding over a work list of the batch's tiles;
    0: one program per tile. ``min_split_tiles``: the fewest KV tiles a split takes, so a short context fills fewer
    than ``num_splits`` (above 1: decode-only batches). ``overlap``: with PDL, the launch runs beside the launch
    before it, which must be this pass's attention over the other rows (see ``KernelOptions.overlap_chunks``)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int = 1
    qlen_filter: int = 0
    strided_per_sm: int = 0
    min_split_tiles: int = 1
    overlap: bool = False


def _check_head_dim(head_dim: int) -> None:
    if head_dim % 16 or not 16 <= head_dim <= 256:
        raise ValueError(f"head_dim {head_dim} unsupported: need a multiple of 16 in [16, 256]")


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 1


def default_config(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor,
                   context_lens: torch.Tensor, strided: bool = False) -> list[AttentionConfig]:
    """Launches for a batch, chosen from shapes alone (no host sync); tile shapes from a GPU sweep
    (``benchmarks/kernels_gpu.py --sweep``; the measurements behind each choice are in benchmarks/RESULTS.md,
    design decisions).

    A decode-only batch (T == B) is one launch with small M tiles and, when B * Hkv programs are fewer than
    the SMs, a KV split toward 4 programs per SM, bounded by the block table's width (a split costs at 2-4
    programs per SM and pays off far below one). At 1-2 programs per SM, two splits that each take at least
    ``LONG_SPLIT_MIN_TILES`` tiles: only long contexts split (see there). Software pipelining: none for a split of
    one or few tiles per program (nothing to pipeline), 2 stages otherwise. A batch with prompt chunks is two
    launches, decodes then the rest, faster than one launch with the chunks' larger tiles; ``strided`` (for CUDA
    graphs), each of the two strides over a work list of its tiles with a bounded grid (see
    ``KernelOptions.graph_programs_per_sm``).
    """
    num_tokens, num_heads, _ = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    num_seqs = context_lens.shape[0]
    decode_m = max(16, triton.next_power_of_2(group))
    if num_tokens > num_seqs:
        chunk = CHUNK_CONFIG if group <= CHUNK_CONFIG.block_m else AttentionConfig(
            triton.next_power_of_2(group), 64, 4, 3, qlen_filter=2)
        options = kernel_options()
        block_n, warps, stages = options.mixed_decode
        block_n = min(block_n, 16384 // triton.next_power_of_2(q.shape[2]))  # K and V tiles fit shared memory
        launches = [AttentionConfig(decode_m, block_n, warps, stages, qlen_filter=1),
                    dataclasses.replace(chunk, overlap=options.overlap_chunks)]
        if strided:
            return [dataclasses.replace(c, strided_per_sm=options.graph_programs_per_sm) for c in launches]
        return launches
    block_n = 64
    programs = num_seqs * num_kv_heads
    sms = _sm_count(q.device)
    max_tiles = triton.cdiv(block_tables.shape[1] * block_size, block_n)
    if programs < sms:
        want = min(triton.cdiv(4 * sms, programs), max_tiles, 32)
        splits = 1 << (want.bit_length() - 1)  # a power of two: fewer kernel variants to compile
        # One KV tile or few per program leaves nothing to pipeline.
        return [AttentionConfig(decode_m, block_n, 4, 1 if splits > 1 else 2, num_splits=splits)]
    if programs < 2 * sms and max_tiles >= 2 * LONG_SPLIT_MIN_TILES:
        return [AttentionConfig(decode_m, block_n, 4, 2, num_splits=2, min_split_tiles=LONG_SPLIT_MIN_TILES)]
    return [AttentionConfig(decode_m, block_n, 4, 2)]


# Decode batches of 1-2 programs per SM split contexts of over this many 64-token tiles in two: long contexts gain
# a lot, short ones would only pay the merge kernel; at 3-4 programs per SM a split gains nothing, and 4 splits did
# no better than 2 (kernels_gpu.py --sweep-long; benchmarks/RESULTS.md, design decisions).
LONG_SPLIT_MIN_TILES = 16

# Prompt chunks: 64 x 64 tiles, 4 warps, 3 stages beat every larger tile of a sweep (prefill_attention_gpu.py;
# benchmarks/RESULTS.md, design decisions).
CHUNK_CONFIG = AttentionConfig(64, 64, 4, 3, qlen_filter=2)

# The per-sequence tile counts of a strided launch are one vector of at least this many lanes: one compiled
# variant for every batch of up to 256 sequences.
MIN_BLOCK_S = 256


def _validate(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"expected q [T, H, D] and caches [blocks, block_size, Hkv, D], got {tuple(q.shape)}, "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if q.shape[2] != k_cache.shape[3]:
        raise ValueError(f"head_dim of q ({q.shape[2]}) and cache ({k_cache.shape[3]}) differ")
    _check_head_dim(q.shape[2])
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"num_heads {q.shape[1]} is not a multiple of num_kv_heads {k_cache.shape[2]}")
    if q.dtype not in _DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"unsupported dtypes q {q.dtype}, caches {k_cache.dtype}/{v_cache.dtype}: "
                         "need one of float16, bfloat16, float32 for all three")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")


def paged_attention_with(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         block_tables: torch.Tensor, context_lens: torch.Tensor, query_start_loc: torch.Tensor,
                         scale: float, cfg: AttentionConfig, out: torch.Tensor | None = None,
                         pdl: bool = False) -> torch.Tensor:
    """``paged_attention`` with an explicit launch config (for tests and tuning); writes into ``out`` if given.
    With ``qlen_filter`` set, rows of the other kind are left untouched. ``pdl``: launch with PDL (``triton_pdl``)."""
    _validate(q, k_cache, v_cache)
    if q.stride(2) != 1:
        q = q.contiguous()
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    if cfg.block_m < group:
        raise ValueError(f"block_m {cfg.block_m} smaller than the GQA group {group}")
    if cfg.overlap and cfg.num_splits > 1:
        raise ValueError("overlap and num_splits > 1 cannot be combined")
    if cfg.qlen_filter and cfg.num_splits > 1:  # the merge rewrites every row, also those filtered out
        raise ValueError("qlen_filter and num_splits > 1 cannot be combined")
    if cfg.strided_per_sm and cfg.num_splits > 1:
        raise ValueError("strided_per_sm and num_splits > 1 cannot be combined")
    num_seqs = context_lens.shape[0]
    if cfg.min_split_tiles > 1 and num_tokens != num_seqs:
        raise ValueError("min_split_tiles > 1 needs a decode-only batch (one token per sequence)")
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    block_q = cfg.block_m // group
    programs = num_seqs if cfg.qlen_filter == 1 else num_tokens // block_q + num_seqs  # enough for every tile
    if cfg.strided_per_sm:
        programs = min(programs, triton.cdiv(cfg.strided_per_sm * _sm_count(q.device), num_kv_heads))
    grid = (programs, num_kv_heads, cfg.num_splits)
    if cfg.num_splits > 1:
        pacc = torch.empty(cfg.num_splits, num_tokens, num_heads, block_d, device=q.device, dtype=torch.float32)
        pm = torch.empty(cfg.num_splits, num_tokens, num_heads, device=q.device, dtype=torch.float32)
        pl = torch.empty_like(pm)
    else:
        pacc = pm = pl = out  # unused
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, context_lens, query_start_loc, pacc, pm, pl,
        scale * _LOG2E, num_seqs, num_tokens, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        HEAD_DIM=head_dim, BLOCK_D=block_d, GROUP=group, BLOCK_M=cfg.block_m, BLOCK_Q=block_q,
        BLOCK_N=cfg.block_n, BLOCK_SIZE=block_size, NUM_SPLITS=cfg.num_splits,
        MIN_SPLIT_TILES=cfg.min_split_tiles, QLEN_FILTER=cfg.qlen_filter,
        STRIDED=cfg.strided_per_sm > 0, EARLY=pdl and cfg.num_splits > 1 and cfg.min_split_tiles == 1,
        OVERLAP=pdl and cfg.overlap,
        BLOCK_S=max(MIN_BLOCK_S, triton.next_power_of_2(num_seqs)) if cfg.strided_per_sm else 1,
        PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_kwargs(pdl))
    if cfg.num_splits > 1:
        _merge_splits_kernel[(num_tokens, num_heads)](
            out, pacc, pm, pl, context_lens, num_tokens, num_heads, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=cfg.num_splits, MIN_SPLIT_TILES=cfg.min_split_tiles,
            BLOCK_N=cfg.block_n,
            BLOCK_S=triton.next_power_of_2(cfg.num_splits), num_warps=4, **launch_kwargs(pdl))
    return out


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    strided: bool = False, pdl: bool = False) -> torch.Tensor:
    """Causal attention of a ragged mixed batch over the paged cache; see ``reference.paged_attention``.
    ``strided``: the launch shape for a CUDA graph (``default_config``); ``pdl``: launch with PDL."""
    _validate(q, k_cache, v_cache)
    out = None
    for cfg in default_config(q, k_cache, block_tables, context_lens, strided):
        out = paged_attention_with(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale, cfg,
                                   out=out, pdl=pdl)
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, pdl: bool = False) -> None:
    """Scatter new keys/values [T, Hkv, D] into the paged cache at ``slot_mapping`` (-1 skips a token);
    ``pdl``: launch with PDL (``triton_pdl``)."""
    if k.shape != v.shape or k.dim() != 3 or k.shape[1:] != k_cache.shape[2:] or k_cache.shape != v_cache.shape:
        raise ValueError(f"expected k, v [T, Hkv, D] matching caches [blocks, block_size, Hkv, D], got "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    _check_head_dim(k.shape[2])
    if k.stride(2) != 1:
        k = k.contiguous()
    if v.stride(2) != 1:
        v = v.contiguous()
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4,
        **launch_kwargs(pdl))
