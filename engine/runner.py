"""ModelRunner: owns the model and its paged KV cache, turns a ``BatchPlan`` into ONE forward pass, samples.

Host work per pass is vectorized numpy that packs every integer input into one int32 array, moved to the
device in one copy (``pack_inputs``). Decode-only passes and passes of up to ``max_graph_tokens`` tokens replay
CUDA graphs (``engine.cuda_graphs``); larger passes run eagerly (their GEMMs are long enough to hide the
launches). Sampling stays on the device; reading the sampled ids is the one host sync of a pass. ``launch``
enqueues a pass and returns before that sync, so the engine can enqueue the next decode pass first (its input
ids read on the device from this pass's argmax; see ``LLMEngine``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from engine.memory import CPU_KV_CACHE_BYTES, kv_block_bytes, num_kv_blocks_for  # noqa: F401 (re-exported)
from engine.models.config import ModelConfig
from engine.models.layers import AttentionMetadata, KVCache
from engine.sampler import Sampler
from engine.scheduler import BatchPlan


@dataclass
class ModelInputs:
    """A plan flattened into the tensors of one forward pass (int32 views of one packed buffer)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S]: the last row of each entry that samples, in plan order


@dataclass
class LaunchedPass:
    """A pass enqueued on the device. ``result()`` waits for it and returns its sampled ids in plan order.
    ``greedy``: those ids still on the device (each row's argmax, taken in a decode graph), when they are what
    the sampler returns: the next decode pass can take its input ids from them without a host round trip."""

    result: Callable[[], list[int]]
    greedy: torch.Tensor | None = None


class Layout:
    """Where each input sits in the packed int32 buffer of a pass of ``tokens`` rows, ``seqs`` sequences, block
    tables ``width`` wide and ``samples`` sampling rows: ids | positions | slots | context lens | qsl | tables |
    sample rows. Each section starts on a 16-byte boundary: Triton specializes a kernel on whether each pointer
    argument is 16-byte aligned, so offsets that moved with the pass's shape compiled new variants mid-run."""

    ALIGN = 4  # int32 elements

    def __init__(self, tokens: int, seqs: int, width: int, samples: int):
        self.tokens, self.seqs, self.width, self.samples = tokens, seqs, width, samples
        sizes = (tokens, tokens, tokens, seqs, seqs + 1, seqs * width, samples)
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + -(-n // self.ALIGN) * self.ALIGN)
        self.sizes = sizes
        self.size = self.offsets[-1]

    def views(self, buf):
        """(ids, positions, slots, context_lens, qsl, block_tables, sample_rows) views of ``buf``."""
        ids, pos, slots, ctx, qsl, tables, rows = (buf[o:o + n] for o, n in zip(self.offsets, self.sizes))
        return ids, pos, slots, ctx, qsl, tables.reshape(self.seqs, self.width), rows

    def inputs(self, buf: torch.Tensor) -> ModelInputs:
        ids, pos, slots, ctx, qsl, tables, rows = self.views(buf)
        return ModelInputs(ids, pos, AttentionMetadata(slots, tables, ctx, qsl), rows)


def pack_inputs(plan: BatchPlan, block_size: int, width: int | None = None, pad_to: Layout | None = None,
                all_rows: bool = False, token_ids: bool = True) -> tuple[np.ndarray, Layout]:
    """The plan's inputs in one int32 array. ``width``: block-table width (default: the longest table).
    ``pad_to``: the layout of a CUDA graph bucket to pad into (see ``engine.cuda_graphs``): for a decode bucket
    (as many tokens as sequences) padding sequences take one token each, write nowhere (slot -1) and attend to
    one cached token; for a mixed bucket padding tokens belong to no sequence and padding sequences are empty,
    and unused sample rows point at row 0. ``all_rows``: no sample rows (the caller takes every row's logits).
    ``token_ids=False`` (decodes only): ids left 0, for a pass whose input ids are written on the device."""
    requests = plan.requests
    num_seqs, num_tokens = len(requests), plan.num_tokens
    tables = [r.block_table for r in requests]
    samples = np.array(plan.samples, dtype=bool)
    if pad_to is None:
        layout = Layout(num_tokens, num_seqs, width or max(len(t) for t in tables),
                        0 if all_rows else int(samples.sum()))
    else:
        layout = pad_to
        decode_bucket = layout.tokens == layout.seqs
        if (num_tokens > layout.tokens or num_seqs > layout.seqs or (decode_bucket and num_tokens != num_seqs)
                or (not all_rows and samples.sum() > layout.samples)):
            raise ValueError(f"cannot pad a pass of {num_tokens} tokens in {num_seqs} sequences into a graph of "
                             f"{layout.tokens} tokens in {layout.seqs} sequences")
    width = layout.width
    buf = np.zeros(layout.size, dtype=np.int32)
    ids, pos, slots, ctx, qsl, bt, rows = layout.views(buf)
    lens = np.fromiter(map(len, tables), dtype=np.int64, count=num_seqs)
    # one vectorized fill (a boolean mask fills row by row, the order of the chained tables)
    bt[:num_seqs][np.arange(width) < lens[:, None]] = np.fromiter(itertools.chain.from_iterable(tables),
                                                                   dtype=np.int32, count=int(lens.sum()))
    starts = np.array(plan.start_positions, dtype=np.int64)
    num_new = np.array(plan.num_new_tokens, dtype=np.int64)
    ends = np.cumsum(num_new)
    qsl[1:num_seqs + 1] = ends
    if num_tokens == num_seqs:  # decodes (and one-token chunks): no per-token expansion needed
        seq_of_token = np.arange(num_seqs)
        positions = starts
        if token_ids:
            ids[:num_tokens] = [r.token_ids(s, s + 1)[0] for r, s in zip(requests, plan.start_positions)]
    else:
        seq_of_token = np.repeat(np.arange(num_seqs), num_new)
        positions = np.arange(num_tokens) - (ends - num_new)[seq_of_token] + starts[seq_of_token]
        token_ids: list[int] = []
        for r, s, n in zip(requests, plan.start_positions, plan.num_new_tokens):
            token_ids += r.token_ids(s, s + n)
        ids[:num_tokens] = token_ids
    pos[:num_tokens] = positions
    slots[:num_tokens] = bt[seq_of_token, positions // block_size] * block_size + positions % block_size
    slots[num_tokens:] = -1
    ctx[:num_seqs] = starts + num_new
    if layout.seqs > num_seqs:
        if layout.tokens == layout.seqs:  # decode bucket: one-token sequences of context 1
            ctx[num_seqs:] = 1
            qsl[num_seqs + 1:] = np.arange(num_tokens + 1, layout.tokens + 1)
        else:  # mixed bucket: empty sequences
            qsl[num_seqs + 1:] = num_tokens
    if not all_rows:
        rows[:int(samples.sum())] = ends[samples] - 1
    return buf, layout


class ModelRunner:
    def __init__(self, model: nn.Module, config: ModelConfig, num_kv_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
                 max_model_len: int | None = None, max_graph_batch: int = 256, max_graph_tokens: int = 0,
                 use_cuda_graphs: bool | None = None):
        self.model = model
        self.config = config
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.device = torch.device(device)
        self.dtype = dtype
        self.sampler = Sampler(seed)
        self.max_model_len = max_model_len or config.max_model_len
        self.max_blocks = -(-self.max_model_len // block_size)  # block-table width of graph inputs
        shape = (config.num_layers, 2, num_kv_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.kv_caches: list[KVCache] = [(layer[0], layer[1]) for layer in self.kv_cache]
        self._staging: torch.Tensor | None = None  # pinned host buffer of ``to_device``
        self._staged = None  # CUDA event: the last copy out of it
        self._sampled_host: list[tuple[torch.Tensor, torch.cuda.Event]] = []  # pinned ring of ``_fetch``
        self.graphs = None
        if use_cuda_graphs is None:
            use_cuda_graphs = self.device.type == "cuda"
        if use_cuda_graphs:
            from engine.cuda_graphs import PassGraphs
            self.graphs = PassGraphs(self, max_graph_batch, max_graph_tokens, capture=self.device.type == "cuda")

    def to_device(self, buf: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """One host-to-device copy of a packed buffer, into ``out`` if given. On CUDA it is asynchronous, through a
        pinned staging buffer kept across passes: pinning a new one per pass cost ~0.1 ms of host time while the
        GPU waited (H200 host, a one-decode pass)."""
        host = torch.from_numpy(buf)
        if self.device.type != "cuda":
            return host if out is None else out[:host.numel()].copy_(host)
        n = host.numel()
        if self._staged is None:
            self._staged = torch.cuda.Event()
        self._staged.synchronize()  # the previous pass's copy has read the staging buffer
        if self._staging is None or self._staging.numel() < n or self._staging.dtype != host.dtype:
            with torch.inference_mode(False):  # a normal tensor: written in and out of inference mode
                self._staging = torch.empty(max(n, 1 << 16), dtype=host.dtype, pin_memory=True)
        staging = self._staging[:n]
        staging.numpy()[:] = buf  # numpy's copy: no torch dispatch on the host path the GPU waits for
        dst = torch.empty(n, dtype=host.dtype, device=self.device) if out is None else out[:n]
        dst.copy_(staging, non_blocking=True)
        self._staged.record()
        return dst

    def prepare_inputs(self, plan: BatchPlan) -> ModelInputs:
        """Flatten the plan: entry i feeds positions start_i .. start_i + n_i - 1 of its request."""
        buf, layout = pack_inputs(plan, self.block_size)
        return layout.inputs(self.to_device(buf))

    @torch.inference_mode()
    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        """Hidden states [T, hidden] of every row."""
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)

    @torch.inference_mode()
    def execute_model(self, inputs: ModelInputs) -> torch.Tensor:
        """The eager forward pass; returns logits [S, vocab] for the sampling rows only."""
        return self.model.compute_logits(self.forward(inputs)[inputs.sample_rows])

    def uses_graph(self, plan: BatchPlan) -> bool:
        return self.graphs is not None and self.graphs.fits(plan)

    @torch.inference_mode()
    def launch(self, plan: BatchPlan, ids_from: torch.Tensor | None = None) -> LaunchedPass:
        """Enqueue one pass for the plan; ``result()`` of the returned pass gives one sampled token id per entry
        with ``samples`` set, in plan order. ``ids_from``: the input ids of a decode-graph pass, on the device
        (the previous pass's ``greedy``) instead of the requests' last tokens."""
        greedy = None
        if self.uses_graph(plan):
            logits, greedy = self.graphs.run_with_greedy(plan, ids_from)
        elif ids_from is not None:
            raise ValueError("ids_from needs a plan that runs a decode graph")
        else:
            logits = self.execute_model(self.prepare_inputs(plan))
        sampling = [r for r, s in zip(plan.requests, plan.samples) if s]
        if not sampling:
            return LaunchedPass(list)
        if greedy is not None and self.sampler.takes_greedy(sampling):
            return LaunchedPass(self._fetch(greedy), greedy)
        return LaunchedPass(lambda: self._sample(logits, sampling, greedy))

    def run(self, plan: BatchPlan) -> list[int]:
        """One pass for the plan, waited for: ``launch(plan).result()``."""
        return self.launch(plan).result()

    @torch.inference_mode()
    def _sample(self, logits: torch.Tensor, requests: list, greedy: torch.Tensor | None) -> list[int]:
        return self.sampler(logits, requests, greedy)

    def _fetch(self, ids: torch.Tensor) -> Callable[[], list[int]]:
        """Start copying ``ids`` to the host; the returned call waits for them. On CUDA the copy goes to one of two
        pinned buffers (a pass and the one enqueued behind it), so a later pass may overwrite ``ids`` on the
        device before the host reads them."""
        if self.device.type != "cuda":
            ids = ids.clone()
            return ids.tolist
        n = ids.numel()
        if not self._sampled_host or self._sampled_host[0][0].numel() < n:
            with torch.inference_mode(False):
                self._sampled_host = [(torch.empty(max(n, 256), dtype=ids.dtype, pin_memory=True),
                                       torch.cuda.Event()) for _ in range(2)]
        self._sampled_host.reverse()
        host, done = self._sampled_host[0]
        host[:n].copy_(ids, non_blocking=True)
        done.record()
        return lambda: (done.synchronize(), host[:n].tolist())[1]
