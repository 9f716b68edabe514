"""A ``BatchPlan`` flattened into the inputs of one forward pass: every integer input packed into one int32
array (``pack_inputs``), laid out by ``Layout``, and viewed as the tensors the model reads (``ModelInputs``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from engine.models.layers import AttentionMetadata
from engine.policy import BatchPlan


@dataclass
class ModelInputs:
    """A plan flattened into the tensors of one forward pass (int32 views of one packed buffer)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S]: the last row of each entry that samples, in plan order


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
