"""``BatchPlan``: what one forward pass carries, as plain data; ``plan_features``: what a pass costs depends on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from engine.policy.request import Request


@dataclass(slots=True)
class BatchPlan:
    """One forward pass. Entry i feeds tokens [start_positions[i], start_positions[i] + num_new_tokens[i]) of
    ``requests[i]``; the first ``num_decodes`` entries are decodes (one token each). ``samples[i]``: the entry
    reaches the end of its request's pending tokens, so the pass samples a token for it."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    start_positions: list[int] = field(default_factory=list)
    samples: list[bool] = field(default_factory=list)
    num_decodes: int = 0
    num_prefill_tokens: int = 0
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + self.num_prefill_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.requests)

    @classmethod
    def of_decodes(cls, requests: list[Request], positions: list[int], preempted: list[Request]) -> BatchPlan:
        """A plan of decodes at ``positions`` (their computed tokens): one token each, always the last pending
        one, so always sampled. Prompt chunks may follow (``add_chunk``)."""
        n = len(requests)
        return cls(requests, [1] * n, positions, [True] * n, n, 0, preempted)

    def add_chunk(self, request: Request, num_tokens: int) -> None:
        """The first ``num_tokens`` of ``request``'s pending tokens: its prompt, or a part of it (a chunk), or after
        a preemption its prompt and the tokens it had generated (recomputed)."""
        start = request.num_computed_tokens
        self.requests.append(request)
        self.num_new_tokens.append(num_tokens)
        self.start_positions.append(start)
        self.samples.append(start + num_tokens == request.num_tokens)
        self.num_prefill_tokens += num_tokens


class PassFeatures(NamedTuple):
    """What the cost of one pass depends on (every cost model reads these and nothing else)."""

    num_tokens: int
    prefill_tokens: int
    decode_tokens: int
    num_seqs: int
    prefill_seqs: int
    decode_context: int  # sum over decodes of their context (tokens attended), for KV bytes read
    prefill_attention: int  # sum over prompt chunks of new tokens x context, for attention FLOPs
    num_samples: int  # entries that sample a token: each becomes an output the serving loop hands out
    # the longest decode context: a decode step's attention waits on it (0: not known, as in older records)
    decode_max_context: int = 0
    # the longest context a prompt chunk attends (prefix + new tokens): a short chunk's attention is one program per
    # 64-query tile and KV head, each reading that whole context, so it waits on it (0: none, or not known)
    prefill_max_context: int = 0

    @classmethod
    def from_mapping(cls, values) -> PassFeatures:
        """The features held under their names in ``values`` (e.g. a profile's measured point, which has more);
        those with a default may be missing."""
        defaults = cls._field_defaults
        return cls._make(values[name] if name in values or name not in defaults else defaults[name]
                         for name in cls._fields)


def plan_features(plan) -> PassFeatures:
    """The features of a pass: ``plan`` is a ``BatchPlan`` or anything with its ``num_decodes``,
    ``num_prefill_tokens``, ``start_positions``, ``num_new_tokens`` and ``samples`` (decodes first)."""
    d, prefill_tokens = plan.num_decodes, plan.num_prefill_tokens
    starts, new, samples = plan.start_positions, plan.num_new_tokens, plan.samples
    num_seqs = len(new)
    prefill_attention = prefill_max_context = 0
    for i in range(d, num_seqs):
        n = new[i]
        end = starts[i] + n
        prefill_attention += n * end
        if end > prefill_max_context:
            prefill_max_context = end
    decode_starts = starts[:d] if d < num_seqs else starts
    # tuple.__new__ directly: a NamedTuple's own constructor is a Python function, a cost on the simulator's
    # hot path
    return _new_tuple(PassFeatures, (d + prefill_tokens, prefill_tokens, d, num_seqs, num_seqs - d,
                                     sum(decode_starts) + d, prefill_attention,
                                     d + sum(samples[d:]) if d < num_seqs else d,
                                     max(decode_starts) + 1 if d else 0, prefill_max_context))


_new_tuple = tuple.__new__


@dataclass(slots=True)
class DecodeAhead:
    """A decode pass enqueued before the tokens of the one it follows are known (``Scheduler.next_decode_plan``,
    input ids read on the device from that pass's argmax), with the KV block each of its entries writes: the
    engine's ``pipeline_decodes``, which the simulator prices as it runs."""

    plan: BatchPlan
    blocks: list[int]

    @classmethod
    def of(cls, plan: BatchPlan, block_size: int) -> DecodeAhead:
        return cls(plan, [r.block_table[p // block_size] for r, p in zip(plan.requests, plan.start_positions)])

    def rows_for(self, plan: BatchPlan | None, block_size: int) -> list[int] | None:
        """This pass's entries that run ``plan``, in ``plan``'s order, when ``plan`` is it or a subset of it (the
        same requests at the same positions in the same KV blocks: requests that finished or were aborted drop
        out); else None, and this pass is wasted."""
        if plan is None or plan.num_tokens != plan.num_seqs or plan.preempted or not plan.requests:
            return None
        row_of = {id(r): i for i, r in enumerate(self.plan.requests)}
        rows = []
        for r, p in zip(plan.requests, plan.start_positions):
            i = row_of.get(id(r))
            if i is None or self.plan.start_positions[i] != p or r.block_table[p // block_size] != self.blocks[i]:
                return None
            rows.append(i)
        return rows
