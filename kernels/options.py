"""The kernel choices a benchmark varies to measure what each buys, as one options object.

The defaults are the engine's. ``kernel_options()`` gives the options in force; ``use_kernel_options(**changes)``
changes them within a ``with`` block (graphs captured inside keep the choices they were captured with). Each
default's measurement is in benchmarks/RESULTS.md, "design decisions".
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """- ``pdl``: Triton kernels launch with programmatic dependent launch inside ``graph_kernels()`` on Hopper and
      later (``SPLITFUSE_PDL=0`` turns it off from the start).
    - ``fused_rotary``: rotary embedding and the KV-cache write as one kernel; False: two.
    - ``fused_mlp``: a decode batch's gate/up projection with its SiLU in the epilogue; False: linear, then
      ``silu_and_mul``.
    - ``mixed_decode``: BLOCK_N, warps and stages of the decode rows' launch in a batch with prompt chunks, the
      fastest of whole 768-token pass graphs recaptured per setting (``pass_timeline_gpu.py --mixed-decode``).
    - ``overlap_chunks``: the chunks' launch of a mixed batch runs beside its decodes' launch (with PDL, in the
      graphs): compute-bound tiles start as the memory-bound decode tiles drain (``pass_timeline_gpu.py
      --overlap``).
    - ``graph_programs_per_sm``: mixed batches captured in a CUDA graph launch at most this many programs per SM
      in each of their two launches, striding over a work list of their tiles: ~4 waves at the 2 programs per SM
      that a 64 x 128 bf16 tile pipeline leaves room for. A graph's grid is sized for its bucket, whose padding
      sequences (256 in a large bucket) would otherwise each take a program per KV head. Eager launches keep one
      program per tile (their grid is tight, and the strided code is slower per tile).
    """

    pdl: bool = os.environ.get("SPLITFUSE_PDL", "1") != "0"
    fused_rotary: bool = True
    fused_mlp: bool = True
    mixed_decode: tuple[int, int, int] = (128, 4, 2)
    overlap_chunks: bool = True
    graph_programs_per_sm: int = 8

    def __post_init__(self) -> None:
        for name in ("pdl", "fused_rotary", "fused_mlp", "overlap_chunks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"kernel option {name} must be True or False, got {getattr(self, name)!r}")
        gpps = self.graph_programs_per_sm
        if not isinstance(gpps, int) or isinstance(gpps, bool) or gpps < 1:
            raise ValueError(f"kernel option graph_programs_per_sm must be a positive integer, got {gpps!r}")
        md = tuple(self.mixed_decode) if isinstance(self.mixed_decode, (tuple, list)) else ()
        if len(md) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in md) \
                or md[0] & (md[0] - 1) or md[0] < 16:
            raise ValueError(f"kernel option mixed_decode must be (BLOCK_N, warps, stages): positive integers, "
                             f"BLOCK_N a power of two of at least 16, got {self.mixed_decode!r}")
        object.__setattr__(self, "mixed_decode", md)


_current = KernelOptions()


def kernel_options() -> KernelOptions:
    """The kernel options in force."""
    return _current


@contextlib.contextmanager
def use_kernel_options(**changes) -> Iterator[KernelOptions]:
    """Within: the options in force with ``changes`` (``KernelOptions`` field names); restored on exit. An unknown
    name or a bad value raises before anything changes."""
    global _current
    unknown = set(changes) - {f.name for f in dataclasses.fields(KernelOptions)}
    if unknown:
        raise ValueError(f"unknown kernel option(s) {sorted(unknown)}; known: "
                         f"{[f.name for f in dataclasses.fields(KernelOptions)]}")
    before, _current = _current, dataclasses.replace(_current, **changes)
    try:
        yield _current
    finally:
        _current = before
