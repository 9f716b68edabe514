"""Which passes a profile measures, and how each becomes a real ``BatchPlan`` (torch-free).

A ``PassSpec`` describes one pass: decodes (one token each, at a given context) and prompt chunks (new tokens
on top of a cached prefix). ``build_plan`` hands its requests to a real SplitFuse scheduler as running requests
whose context is already computed (``Scheduler.add_running``: KV blocks taken, contents irrelevant for timing),
then lets it schedule them, so the plan is exactly what the engine would run and the scheduling time is that of
the engine's own policy code.
"""

from __future__ import annotations

import gc
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.policy import BatchPlan, PolicyConfig, Request, SamplingParams, Scheduler, make_scheduler

PREFILL_MAX = 8192
DECODE_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DECODE_CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192)
MIXED_BUDGETS = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
# Sweeps replayed for their time only: their ~900 passes add nothing to the energy fit that the grids lack.
TIME_ONLY_SWEEPS = ("decode-table", "mixed-graph")
# The sweep kinds a pass belongs to (``PassSpec.sweep``); "eager-mixed" are the SplitFuse passes of budgets over
# the largest mixed-graph bucket, which the engine runs eagerly, and "mixed-graph" exists only with ``per_bucket``.
SWEEP_KINDS = ("prefill", "decode", "mixed", "eager-mixed", "decode-table", "mixed-graph")
KV_LAYOUTS = ("fresh", "aged")  # how a pass's KV blocks lie: handed out in order, or as age_kv_cache leaves them


@dataclass(frozen=True)
class PassSpec:
    """One pass: decode contexts, and chunks as (cached prefix, new tokens, prompt tokens left afterwards)."""

    sweep: str
    decode_contexts: tuple[int, ...] = ()
    chunks: tuple[tuple[int, int, int], ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.decode_contexts) + self.num_prefill_tokens

    # A plan's shape, so that ``plan_features(spec)`` gives the features of the plan ``build_plan`` makes.
    @property
    def num_decodes(self) -> int:
        return len(self.decode_contexts)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for _, n, _ in self.chunks)

    @property
    def start_positions(self) -> list[int]:
        return [*self.decode_contexts, *(prefix for prefix, _, _ in self.chunks)]

    @property
    def num_new_tokens(self) -> list[int]:
        return [1] * len(self.decode_contexts) + [n for _, n, _ in self.chunks]

    @property
    def samples(self) -> list[bool]:
        return [True] * len(self.decode_contexts) + [left == 0 for _, _, left in self.chunks]

    @property
    def key(self) -> str:
        """Stable identity, for resuming a sweep."""
        digest = hashlib.sha1(repr((self.decode_contexts, self.chunks)).encode()).hexdigest()[:16]
        return f"{self.sweep}-{self.num_tokens}-{digest}"

    def blocks_needed(self, block_size: int) -> int:
        blocks = sum(-(-(c + 1) // block_size) for c in self.decode_contexts)
        return blocks + sum(-(-(s + n) // block_size) for s, n, _ in self.chunks)

    def max_len(self) -> int:
        """The longest sequence's length: a decode's context and its new token; a prompt and the token it samples
        once all of it is in (its request is refused if that does not fit the model's context)."""
        lens = [c + 1 for c in self.decode_contexts] + [s + n + left + 1 for s, n, left in self.chunks]
        return max(lens)


def prefill_sizes(max_tokens: int = PREFILL_MAX, rng: np.random.Generator | None = None,
                  extra: int = 32) -> list[int]:
    """1..max_tokens: every size to 16, then steps of 16/32/128 (tile steps show), plus random sizes."""
    sizes = set(range(1, 17)) | set(range(16, 513, 16)) | set(range(512, 2049, 32)) | set(range(2048, 8193, 128))
    if rng is not None:
        sizes |= {int(x) for x in rng.integers(1, max_tokens + 1, size=extra)}
    return sorted(s for s in sizes if s <= max_tokens)


def sweep_specs(max_model_len: int, num_kv_blocks: int, block_size: int, seed: int = 0,
                mixed_per_budget: int = 16, random_decodes: int = 96, max_num_seqs: int = 512,
                table_per_size: int = 8, mixed_buckets: Sequence[int] = (), per_bucket: int = 0) -> list[PassSpec]:
    """All passes of a profile, in a seeded random order (so a time-boxed run covers every region evenly).

    Decodes come three ways: a grid of graph-bucket batch sizes at one context each (the anchors), random
    batches as a server forms them (any size, contexts spread around a mean: a served batch mixes lengths, and
    a partly filled graph bucket costs otherwise than a full one), and the decode table's batches
    (``decode_table_specs``, ``table_per_size`` per batch size; 0: none). Mixed passes draw their decode count
    log-uniformly, so batches of a few decodes are measured as often as those the KV cache fills; those of budgets
    over the engine's largest ``mixed_buckets`` run eagerly and are of kind "eager-mixed". With ``per_bucket`` > 0,
    that many more per mixed-graph bucket (``mixed_graph_specs``)."""
    rng = np.random.default_rng(seed)
    specs: list[PassSpec] = []
    for t in prefill_sizes(rng=rng):  # (a) pure prefill; split into sequences the context can hold
        per_seq = max_model_len - 1
        chunks = []
        while t > 0:
            n = min(t, per_seq)
            chunks.append((0, n, 0))
            t -= n
        specs.append(PassSpec("prefill", chunks=tuple(chunks)))
    top = max_model_len - 1
    for b in DECODE_BATCHES:  # (b) pure decode
        for c in DECODE_CONTEXTS:
            specs.append(PassSpec("decode", decode_contexts=(min(c, top - 1),) * b))
    kv_tokens = int(0.85 * num_kv_blocks) * block_size
    for i in range(random_decodes):
        count = int(rng.integers(1, 65)) if i % 2 else _log_uniform_int(rng, 1, 512)
        contexts = _spread_contexts(rng, count, 8192, top, kv_tokens, block_size)
        if contexts:
            specs.append(PassSpec("decode", decode_contexts=contexts))
    for budget in MIXED_BUDGETS:  # (c) SplitFuse: decodes fill part of the budget, chunks the rest
        kind = "eager-mixed" if mixed_buckets and budget > mixed_buckets[-1] else "mixed"
        for _ in range(mixed_per_budget):
            specs.append(_mixed_spec(rng, budget, top, kv_tokens, block_size, max_num_seqs, kind))
    if table_per_size:
        specs += decode_table_specs(max_model_len, num_kv_blocks, block_size, seed, min(max_num_seqs, 256),
                                    table_per_size)
    if mixed_buckets and per_bucket:
        specs += mixed_graph_specs(max_model_len, num_kv_blocks, block_size, mixed_buckets, seed, per_bucket,
                                   max_num_seqs)
    specs = list(dict.fromkeys(specs))  # capped contexts can repeat a pass
    fits = [s for s in specs if s.max_len() <= max_model_len and s.blocks_needed(block_size) <= num_kv_blocks
            and len(s.decode_contexts) + len(s.chunks) <= max_num_seqs]
    order = rng.permutation(len(fits))
    return [fits[i] for i in order]


def decode_table_specs(max_model_len: int, num_kv_blocks: int, block_size: int, seed: int = 0,
                       max_num_seqs: int = 256, per_size: int = 8) -> list[PassSpec]:
    """Decode batches for the decode-graph table (``calibration.decode_table``): every batch size to 64, then
    every 8th to 128 and every 16th to ``max_num_seqs``, each at ``per_size`` mean contexts (one per log-spaced
    stratum of [128, 4096]) spread 0.5-1.5x around the mean as a served batch's are. A decode step's time jumps
    between neighbouring sizes (graph padding, attention waves over the SMs), which a line through the buckets
    misses."""
    rng = np.random.default_rng(seed + 7)
    top = max_model_len - 1
    kv_tokens = int(0.85 * num_kv_blocks) * block_size
    sizes = [*range(1, 65), *range(72, 129, 8), *range(144, 257, 16)]
    edges = np.exp(np.linspace(np.log(128), np.log(min(4096, top - 1)), per_size + 1))
    specs: list[PassSpec] = []
    for n in (s for s in sizes if s <= max_num_seqs):
        for lo, hi in zip(edges, edges[1:]):
            mean = np.exp(rng.uniform(np.log(lo), np.log(hi)))
            contexts = np.clip(mean * rng.uniform(0.5, 1.5, size=n), 1, top - 1).astype(int)
            if int(np.sum(contexts + 1 + block_size)) <= kv_tokens:
                specs.append(PassSpec("decode-table", decode_contexts=tuple(contexts.tolist())))
    order = rng.permutation(len(specs))
    return [specs[i] for i in order]


def mixed_graph_specs(max_model_len: int, num_kv_blocks: int, block_size: int, buckets: Sequence[int],
                      seed: int = 0, per_bucket: int = 12, max_num_seqs: int = 512) -> list[PassSpec]:
    """Mixed passes as a SplitFuse server forms them, ``per_bucket`` for each mixed-graph bucket: a token count
    in the bucket's range, a log-uniform count of decodes (0 up to all but one token) at contexts spread around
    a mean of 128-4096 tokens, the rest one prompt chunk (sometimes two). The grid of ``sweep_specs`` fills whole
    budgets and caps its decodes by KV capacity, which leaves a served pass's cost per decode, above all at short
    contexts, to extrapolation."""
    rng = np.random.default_rng(seed + 11)
    top = max_model_len - 1
    kv_tokens = int(0.85 * num_kv_blocks) * block_size
    specs: list[PassSpec] = []
    for low, bucket in zip((1, *buckets), buckets):
        for _ in range(per_bucket):
            tokens = int(rng.integers(max(low, 1) + 1, bucket + 1))
            wanted = min(_log_uniform_int(rng, 1, tokens) - 1, max_num_seqs - 2)
            prompt = tokens - wanted
            sizes = [prompt]
            if prompt >= 2 and rng.random() < 0.3:  # a prompt finished mid-pass and the next one began
                cut = int(rng.integers(1, prompt))
                sizes = [cut, prompt - cut]
            chunks = []
            for i, n in enumerate(sizes):
                prefix = 0 if i else min(int(rng.integers(0, max(1, top - n))), int(rng.integers(0, 4097)))
                partial = i == len(sizes) - 1 and rng.random() < 0.7  # else the prompt ends here and samples
                left = int(rng.integers(0, max(1, top - prefix - n))) if partial else 0
                chunks.append((prefix, n, left))
            allowance = kv_tokens - sum(p + n + left + block_size for p, n, left in chunks)
            contexts = _spread_contexts(rng, wanted, 4096, top, allowance, block_size) if wanted else ()
            specs.append(PassSpec("mixed-graph", decode_contexts=contexts, chunks=tuple(chunks)))
    return specs


def _mixed_spec(rng: np.random.Generator, budget: int, top: int, kv_tokens: int, block_size: int,
                max_num_seqs: int, sweep: str = "mixed") -> PassSpec:
    """1-3 chunks on cached prefixes, beside a log-uniform count of decodes (0 up to 90% of the budget, and no
    more sequences than a batch takes) at contexts spread around a random mean, as many as the KV cache holds."""
    wanted = min(_log_uniform_int(rng, 1, int(0.9 * budget) + 1) - 1, max_num_seqs - 3)
    left = budget - wanted
    num_chunks = min(int(rng.integers(1, 4)), left)
    cuts = np.sort(rng.choice(np.arange(1, left), size=num_chunks - 1, replace=False)) if num_chunks > 1 else []
    chunks = []
    sizes = np.diff(np.concatenate([[0], cuts, [left]])).astype(int).tolist()
    for i, n in enumerate(sizes):
        prefix = min(int(rng.integers(0, max(1, top - n))), int(rng.integers(0, 4097)))
        # only the last chunk of a SplitFuse pass can stop short of its prompt's end
        partial = i == len(sizes) - 1 and rng.random() < 0.7
        remaining = int(rng.integers(0, max(1, top - prefix - n))) if partial else 0
        chunks.append((prefix, n, remaining))
    allowance = kv_tokens - sum(p + n + block_size for p, n, _ in chunks)
    contexts = _spread_contexts(rng, wanted, 4096, top, allowance, block_size) if wanted else ()
    return PassSpec(sweep, decode_contexts=contexts, chunks=tuple(chunks))


def _log_uniform_int(rng: np.random.Generator, low: int, high: int) -> int:
    """An integer in [low, high], log-uniform (small values as often per octave as large ones)."""
    return min(high, int(np.exp(rng.uniform(np.log(low), np.log(high + 1)))))


def _spread_contexts(rng: np.random.Generator, count: int, longest: int, top: int, allowance: int,
                     block_size: int) -> tuple[int, ...]:
    """Up to ``count`` decode contexts: a log-uniform mean in [128, ``longest``], each context 0.5-1.5 times it,
    below ``top``; as many as ``allowance`` KV tokens hold."""
    mean = np.exp(rng.uniform(np.log(128), np.log(min(longest, top - 1))))
    contexts = np.clip(mean * rng.uniform(0.5, 1.5, size=count), 1, top - 1).astype(int)
    taken = np.cumsum(contexts + 1 + block_size)  # each decode's new token, and its last block's unused part
    return tuple(contexts[taken <= allowance].tolist())


def build_plan(spec: PassSpec, num_kv_blocks: int, block_size: int, rng: np.random.Generator, vocab_size: int,
               max_model_len: int, sampling_params: SamplingParams | None = None, aged_kv: bool = False
               ) -> tuple[Scheduler, BatchPlan, float]:
    """(scheduler, plan, seconds the scheduler took) for ``spec``; the scheduler's block tables index a KV cache
    of ``num_kv_blocks`` blocks, handed out in order (a fresh cache) or, with ``aged_kv``, in the order a
    long-running server leaves them (``age_kv_cache``). The caller runs the plan, then ``release``."""
    config = PolicyConfig(max_num_batched_tokens=spec.num_tokens, block_size=block_size,
                          max_num_seqs=len(spec.decode_contexts) + len(spec.chunks) + 1)
    sched = make_scheduler(config, num_kv_blocks, max_model_len)
    if aged_kv:
        age_kv_cache(sched, rng, vocab_size, max_model_len)
    params = sampling_params or SamplingParams(max_tokens=max_model_len)
    for i, ctx in enumerate(spec.decode_contexts):  # a decode: its prompt computed and one token sampled
        r = _request(i, ctx, params, rng, vocab_size, max_model_len)
        sched.add_running(r, ctx, sampled_token=int(rng.integers(0, vocab_size)))
    for j, (prefix, n, left) in enumerate(spec.chunks):
        r = _request(len(spec.decode_contexts) + j, prefix + n + left, params, rng, vocab_size, max_model_len)
        sched.add_running(r, prefix)
    # The set-up above made hundreds of thousands of token ids; collect now so that a full collection it made due
    # does not land in the one timed schedule().
    gc.collect()
    t0 = time.perf_counter()
    plan = sched.schedule()
    seconds = time.perf_counter() - t0
    if plan is None or plan.num_decodes != len(spec.decode_contexts) or plan.num_tokens != spec.num_tokens \
            or plan.preempted:
        release(sched)
        raise RuntimeError(f"the scheduler did not reproduce pass {spec.key} (KV capacity too small?)")
    return sched, plan, seconds


def age_kv_cache(sched: Scheduler, rng: np.random.Generator, vocab_size: int, max_model_len: int,
                 rounds: int = 4) -> None:
    """Leave ``sched``'s free blocks in the order a long-running server leaves them: ``rounds`` times the cache is
    filled by requests of random lengths and emptied in random order. The free queue hands out the blocks freed
    longest ago first (FIFO, for prefix-cache eviction), so a request admitted afterwards gets blocks scattered over
    the whole cache, where one admitted to a fresh cache gets consecutive ones."""
    bm, params, n = sched.block_manager, SamplingParams(max_tokens=1), 0
    for _ in range(rounds):
        ids = []
        while bm.num_free_blocks > 1:
            blocks = int(rng.integers(1, min(bm.num_free_blocks, 256, max_model_len // bm.block_size) + 1))
            tokens = min(blocks * bm.block_size, max_model_len - 1)
            request = Request(f"aging{n}", rng.integers(0, vocab_size, size=tokens).tolist(), params,
                              max_model_len=max_model_len)
            sched.add_running(request, tokens)
            ids.append(request.request_id)
            n += 1
        for i in rng.permutation(len(ids)):
            sched.abort(ids[i])


def release(sched: Scheduler) -> None:
    """End every request of the pass, freeing its blocks."""
    for r in list(sched.running):
        sched.abort(r.request_id)


def _request(i: int, prompt_len: int, params: SamplingParams, rng: np.random.Generator, vocab_size: int,
             max_model_len: int) -> Request:
    ids = rng.integers(0, vocab_size, size=prompt_len).tolist()
    return Request(f"p{i}", ids, params, arrival_time=float(i), max_model_len=max_model_len)
