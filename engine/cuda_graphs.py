"""CUDA graphs of decode-only passes, one per bucketed batch size.

A decode pass launches ~16 small kernels per layer; replaying a captured graph removes their launch cost.
Every graph reads its inputs from views of one static int32 buffer (laid out as ``runner.Layout`` for its
bucket), so a pass is one host-to-device copy into that buffer plus one replay. A batch is padded up to the
next bucket with one-token sequences that write no key/value. Block tables are ``max_model_len`` wide, so
every context fits every graph. Off CUDA (``capture=False``) the same buffers run eagerly: the CPU tests check
the packing and padding that the graphs rely on.
"""

from __future__ import annotations

import torch

from engine.runner import Layout, pack_inputs
from engine.scheduler import BatchPlan

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def bucket_sizes(max_batch: int) -> list[int]:
    """The buckets up to ``max_batch``, which is always one (so every batch up to it has a graph)."""
    return [b for b in BUCKETS if b < max_batch] + [max_batch]


class DecodeGraphs:
    def __init__(self, runner, max_batch: int, capture: bool = True):
        self.runner = runner
        self.buckets = bucket_sizes(max_batch)
        self.max_batch = max_batch
        self.width = runner.max_blocks
        self.capture = capture
        self.static = torch.zeros(Layout(max_batch, max_batch, self.width, 0).size, dtype=torch.int32,
                                  device=runner.device)
        self.layouts = {b: Layout(b, b, self.width, 0) for b in self.buckets}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def fits(self, plan: BatchPlan) -> bool:
        """Decode-only passes (every entry one token) up to the largest bucket."""
        return plan.num_tokens == plan.num_seqs <= self.max_batch

    def bucket(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def _forward(self, batch: int) -> torch.Tensor:
        inputs = self.layouts[batch].inputs(self.static)
        return self.runner.model.compute_logits(self.runner.forward(inputs))

    def _fill_padding(self, batch: int) -> None:
        """Inputs of ``batch`` padding sequences only: safe to run (nothing is written to the cache)."""
        ids, pos, slots, ctx, qsl, tables, _ = self.layouts[batch].views(self.static)
        ids.zero_(), pos.zero_(), slots.fill_(-1), ctx.fill_(1), tables.zero_()
        qsl.copy_(torch.arange(batch + 1, dtype=torch.int32, device=qsl.device))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for batch in reversed(self.buckets):  # largest first, so smaller graphs reuse its memory pool
            self._fill_padding(batch)
            self._forward(batch)  # compiles this shape's kernels (Triton JIT) outside the capture
            torch.cuda.synchronize(self.runner.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch] = self._forward(batch)
            pool = graph.pool()
            self.graphs[batch] = graph
        torch.cuda.synchronize(self.runner.device)

    @torch.inference_mode()
    def run(self, plan: BatchPlan) -> torch.Tensor:
        """Logits [S, vocab] of the plan's sampling rows, through the graph of the plan's bucket."""
        batch = self.bucket(plan.num_seqs)
        buf, layout = pack_inputs(plan, self.runner.block_size, width=self.width, pad_to=batch, all_rows=True)
        self.runner.to_device(buf, out=self.static)
        if self.capture:
            self.graphs[batch].replay()
            logits = self.logits[batch]
        else:
            logits = self._forward(batch)
        n = plan.num_seqs
        if all(plan.samples):
            return logits[:n]
        rows = [i for i, s in enumerate(plan.samples) if s]
        return logits[torch.tensor(rows, device=logits.device)]
