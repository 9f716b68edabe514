"""ModelRunner: owns the model and its paged KV cache, turns a ``BatchPlan`` into ONE forward pass, samples.

Host work per pass is vectorized numpy that packs every integer input into one int32 array, moved to the
device in one copy (``engine.inputs.pack_inputs``). Decode-only passes and passes of up to ``max_graph_tokens``
tokens replay CUDA graphs (``engine.cuda_graphs``); larger passes run eagerly (their GEMMs are long enough to
hide the launches). Sampling stays on the device; reading the sampled ids is the one host sync of a pass. ``launch``
enqueues a pass and returns before that sync, so the engine can enqueue the next decode pass first (its input
ids read on the device from this pass's argmax; see ``LLMEngine``). ``launch(plan, use_graphs=False)`` runs a plan
eagerly even where a graph fits it, and ``launch(plan, timed=True)`` records CUDA events around the launch (for
``LaunchedPass.device_s``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from engine.inputs import ModelInputs, pack_inputs
from engine.models.config import ModelConfig
from engine.models.layers import KVCache
from engine.policy import BatchPlan
from engine.sampler import Sampler


@dataclass
class LaunchedPass:
    """A pass enqueued on the device. ``result()`` waits for it and returns its sampled ids in plan order.
    ``greedy``: those ids still on the device (each row's argmax, taken in a decode graph), when they are what
    the sampler returns: the next decode pass can take its input ids from them without a host round trip."""

    result: Callable[[], list[int]]
    greedy: torch.Tensor | None = None
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # around its launch, when timed

    def device_s(self) -> float | None:
        """Device seconds from the start of its launch to its end (GPU idle while the host enqueued it counts), or
        None when it was not timed. Call it after ``result()``."""
        if self.events is None:
            return None
        start, end = self.events
        end.synchronize()
        return start.elapsed_time(end) / 1e3


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
            self.rebuild_graphs(max_graph_batch, max_graph_tokens)

    def to_device(self, buf: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """One host-to-device copy of a packed buffer, into ``out`` if given. On CUDA it is asynchronous, through a
        pinned staging buffer kept across passes: pinning a new one per pass costs host time while the GPU waits."""
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

    def path(self, plan: BatchPlan) -> str:
        """How ``plan`` runs: "decode-graph", "mixed-graph" or "eager"."""
        key = self.graphs.key(plan) if self.graphs is not None else None
        return "eager" if key is None else f"{key[0]}-graph"

    @torch.inference_mode()
    def launch(self, plan: BatchPlan, ids_from: torch.Tensor | None = None, use_graphs: bool = True,
               timed: bool = False) -> LaunchedPass:
        """Enqueue one pass for the plan; ``result()`` of the returned pass gives one sampled token id per entry
        with ``samples`` set, in plan order. ``ids_from``: the input ids of a decode-graph pass, on the device
        (the previous pass's ``greedy``) instead of the requests' last tokens. ``use_graphs=False``: an eager pass
        even where a graph fits. ``timed``: on CUDA, record events around the launch (``LaunchedPass.device_s``)."""
        events = None
        if timed and self.device.type == "cuda":
            events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            events[0].record()
        greedy = None
        if use_graphs and self.uses_graph(plan):
            logits, greedy = self.graphs.run_with_greedy(plan, ids_from)
        elif ids_from is not None:
            raise ValueError("ids_from needs a plan that runs a decode graph")
        else:
            logits = self.execute_model(self.prepare_inputs(plan))
        sampling = [r for r, s in zip(plan.requests, plan.samples) if s]
        if not sampling:
            launched = LaunchedPass(list)
        elif greedy is not None and self.sampler.takes_greedy(sampling):
            launched = LaunchedPass(self._fetch(greedy), greedy)
        else:
            launched = LaunchedPass(lambda: self._sample(logits, sampling, greedy))
        if events is not None:
            events[1].record()
            launched.events = events
        return launched

    def run(self, plan: BatchPlan, use_graphs: bool = True) -> list[int]:
        """One pass for the plan, waited for: ``launch(plan, use_graphs=use_graphs).result()``."""
        return self.launch(plan, use_graphs=use_graphs).result()

    def rebuild_graphs(self, max_batch: int, max_tokens: int = 0, mixed_buckets: tuple[int, ...] | None = None
                       ) -> None:
        """Replace the pass graphs with ones for decode batches up to ``max_batch`` and passes of up to
        ``max_tokens`` tokens (captured now on CUDA, with the kernel options in force; elsewhere their buffers run
        eagerly). ``mixed_buckets``: the mixed-pass token buckets below ``max_tokens`` (default: the engine's).
        The old graphs are released first, so one set is alive at a time. Not while a launched pass is pending."""
        from engine.cuda_graphs import MIXED_BUCKETS, PassGraphs

        if self.graphs is not None and self.device.type == "cuda":
            self.graphs = None
            gc.collect()
            torch.cuda.empty_cache()
        self.graphs = PassGraphs(self, max_batch, max_tokens, capture=self.device.type == "cuda",
                                 mixed_buckets=MIXED_BUCKETS if mixed_buckets is None else tuple(mixed_buckets))

    def replay_graph(self, plan: BatchPlan) -> None:
        """Replay the CUDA graph that ran ``plan`` (``run(plan)`` first): its GPU work alone, no host work
        (``PassGraphs.replay``). ValueError without graphs or when none runs the plan."""
        if self.graphs is None:
            raise ValueError("this runner has no pass graphs")
        self.graphs.replay(plan)

    def close(self) -> None:
        """Drop the graphs, the KV cache and the model (their device memory goes back to torch's allocator)."""
        self.graphs = self.model = self.kv_cache = self._staging = self._staged = None
        self.kv_caches = []
        self._sampled_host = []

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
