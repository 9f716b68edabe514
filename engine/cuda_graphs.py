"""CUDA graphs of whole passes: decode-only passes bucketed by batch size, and passes with prompt tokens
(chunks, with or without decodes) bucketed by token count.

An eager pass launches about 13 kernels per layer from Python: for a 7B model that host time is longer than the
GPU work of a pass of a few hundred tokens, and jittery (benchmarks/RESULTS.md, design decisions). Replaying a
captured graph removes that cost.

Every graph reads its inputs from views of one static int32 buffer (laid out as ``inputs.Layout`` for its
bucket), so a pass is one host-to-device copy into that buffer plus one replay. Padding differs by kind:
- decode graphs (``b`` tokens, ``b`` sequences): a batch is padded with one-token sequences that write no
  key/value and attend to one cached token;
- mixed graphs (``T`` tokens, ``S = min(T - 1, max_batch)`` sequences): padding tokens belong to no sequence
  (they write nowhere and their attention rows are never read) and padding sequences are empty. ``T > S``, so
  the attention kernel takes its mixed launch shape for every plan; a plan with ``t > s`` tokens and sequences
  has ``s <= t - 1 <= T - 1``, so the smallest token bucket ``T >= t`` always holds it. The logits of the
  ``S`` sample rows are computed inside the graph (padding rows point at row 0).
Block tables are ``max_model_len`` wide, so every context fits every graph. Off CUDA (``capture=False``) the
same buffers run eagerly: the CPU tests check the packing and padding that the graphs rely on.
"""

from __future__ import annotations

import torch

import kernels
from engine.inputs import Layout, pack_inputs
from engine.policy import BatchPlan

DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
# Fine steps where a pass reads the weights (padding is free), coarser where the GEMMs are compute-bound.
MIXED_BUCKETS = tuple(range(16, 257, 16)) + tuple(range(320, 1025, 64))
MAX_GRAPH_TOKENS = 1024  # above this an eager pass's GPU work hides its launches


def bucket_sizes(max_size: int, buckets=DECODE_BUCKETS) -> list[int]:
    """The buckets below ``max_size``, then ``max_size`` itself (so every size up to it has a graph)."""
    return [b for b in buckets if b < max_size] + [max_size]


class PassGraphs:
    def __init__(self, runner, max_batch: int, max_tokens: int = 0, capture: bool = True,
                 mixed_buckets: tuple[int, ...] = MIXED_BUCKETS):
        self.runner = runner
        self.max_batch = max_batch
        self.buckets = bucket_sizes(max_batch)
        self.mixed_buckets = bucket_sizes(max_tokens, mixed_buckets) if max_tokens > 1 else []
        self.width = runner.max_blocks
        self.capture = capture
        self.layouts = {("decode", b): Layout(b, b, self.width, 0) for b in self.buckets}
        self.layouts.update({("mixed", t): Layout(t, min(t - 1, max_batch), self.width, min(t - 1, max_batch))
                             for t in self.mixed_buckets})
        self.static = torch.zeros(max(lay.size for lay in self.layouts.values()), dtype=torch.int32,
                                  device=runner.device)
        self.graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[str, int], torch.Tensor] = {}
        self.greedy: dict[tuple[str, int], torch.Tensor] = {}  # argmax of each logits row, computed in the graph
        if capture:
            self._capture_all()

    def key(self, plan: BatchPlan) -> tuple[str, int] | None:
        """The graph that runs ``plan``, or None for an eager pass."""
        t, s = plan.num_tokens, plan.num_seqs
        if t == s:
            return ("decode", next(b for b in self.buckets if b >= t)) if t <= self.max_batch else None
        if self.mixed_buckets and t <= self.mixed_buckets[-1]:
            return "mixed", next(b for b in self.mixed_buckets if b >= t)
        return None

    def fits(self, plan: BatchPlan) -> bool:
        return self.key(plan) is not None

    def padded_tokens(self, plan: BatchPlan) -> int | None:
        """The token count a mixed-graph pass is padded to (None for decode-graph and eager passes)."""
        key = self.key(plan)
        return key[1] if key is not None and key[0] == "mixed" else None

    def _forward(self, key: tuple[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = self.layouts[key].inputs(self.static)
        hidden = self.runner.forward(inputs)
        logits = self.runner.model.compute_logits(hidden if key[0] == "decode" else hidden[inputs.sample_rows])
        return logits, logits.argmax(dim=-1)

    def _fill_padding(self, key: tuple[str, int]) -> None:
        """Inputs of padding only: safe to run (nothing is written to the cache)."""
        layout = self.layouts[key]
        ids, pos, slots, ctx, qsl, tables, rows = layout.views(self.static)
        ids.zero_(), pos.zero_(), slots.fill_(-1), ctx.fill_(1), tables.zero_(), rows.zero_()
        if key[0] == "decode":  # one-token sequences of context 1
            qsl.copy_(torch.arange(layout.seqs + 1, dtype=torch.int32, device=qsl.device))
        else:  # empty sequences
            qsl.zero_()

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        # largest first, so smaller graphs reuse its memory pool
        for key in sorted(self.layouts, key=lambda k: self.layouts[k].size, reverse=True):
            self._fill_padding(key)
            with kernels.graph_kernels():  # the graphs' kernel choices, in the warm-up and in the graph
                self._forward(key)  # compiles this shape's kernels (Triton JIT) outside the capture
                torch.cuda.synchronize(self.runner.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.logits[key], self.greedy[key] = self._forward(key)
            pool = graph.pool()
            self.graphs[key] = graph
        torch.cuda.synchronize(self.runner.device)

    def replay(self, plan: BatchPlan) -> None:
        """Replay the graph of ``plan``'s bucket on the inputs it last ran with: no packing, no copy, no
        sampling (its GPU work alone, to time). ValueError when no captured graph runs the plan."""
        key = self.key(plan)
        if key is None or key not in self.graphs:
            raise ValueError(f"no captured graph runs a pass of {plan.num_tokens} tokens over {plan.num_seqs} "
                             f"sequences")
        self.graphs[key].replay()

    @torch.inference_mode()
    def run(self, plan: BatchPlan) -> torch.Tensor:
        """Logits [S, vocab] of the plan's sampling rows, through the graph of the plan's bucket."""
        return self.run_with_greedy(plan)[0]

    @torch.inference_mode()
    def run_with_greedy(self, plan: BatchPlan, ids_from: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """``run``, and the argmax of each of those rows, taken inside the graph (a greedy pass then needs no
        sampling kernels after it). ``ids_from``: a decode pass's input ids, copied on the device."""
        key = self.key(plan)
        layout = self.layouts[key]
        if ids_from is not None and key[0] != "decode":
            raise ValueError("ids_from needs a decode-only plan")
        buf, _ = pack_inputs(plan, self.runner.block_size, pad_to=layout, all_rows=key[0] == "decode",
                             token_ids=ids_from is None)
        self.runner.to_device(buf, out=self.static)
        if ids_from is not None:
            self.static[:plan.num_tokens].copy_(ids_from[:plan.num_tokens])  # ids are the layout's first section
        if self.capture:
            self.graphs[key].replay()
            logits, greedy = self.logits[key], self.greedy[key]
        else:
            logits, greedy = self._forward(key)
        if key[0] == "mixed":
            n = sum(plan.samples)
            return logits[:n], greedy[:n]
        if all(plan.samples):
            return logits[:plan.num_seqs], greedy[:plan.num_seqs]
        rows = torch.tensor([i for i, s in enumerate(plan.samples) if s], device=logits.device)
        return logits[rows], greedy[rows]
