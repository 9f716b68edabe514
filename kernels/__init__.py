"""Kernels of the engine's forward pass, each as a plain-PyTorch reference and a Triton version.

- ``reference.py``: the PyTorch versions; the CPU path and the oracle of the tests.
- ``triton_attention.py``: paged KV-cache write and paged attention of a ragged mixed batch (prompt chunks and
  decodes, GQA, flash-decoding split for small decode batches).
- ``triton_norm.py``: fused residual add + RMSNorm.  ``triton_rotary.py``: rotary embedding of q and k.
- ``triton_activation.py``: fused SiLU-and-multiply of a merged gate/up projection.
- ``triton_linear.py``: linear layers of few rows (decode batches) as one weight stream, no split-K; used inside
  ``graph_kernels()``, which the engine's CUDA-graph capture enters.

The functions below dispatch: Triton when the tensor is on a CUDA device and triton imports, else the
reference. Triton is imported lazily, so this package imports on machines without it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib

import torch

from kernels import reference


@functools.cache
def triton_available() -> bool:
    """Whether triton imports here (it is a dev dependency, absent on some CPU installs)."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def _impl(module: str, x: torch.Tensor):
    if x.is_cuda and triton_available():
        return importlib.import_module(f"kernels.{module}")
    return reference


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """See ``reference.write_kv``."""
    _impl("triton_attention", k_cache).write_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """See ``reference.paged_attention``."""
    impl = _impl("triton_attention", q)
    if impl is reference:
        return reference.paged_attention(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale)
    return impl.paged_attention(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale,
                                strided=_GRAPH_KERNELS)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``reference.rms_norm``."""
    return _impl("triton_norm", x).rms_norm(x, weight, eps, residual)


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``reference.rotary_embedding``."""
    return _impl("triton_rotary", q).rotary_embedding(q, k, positions, cos_sin_cache)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """See ``reference.silu_and_mul``."""
    return _impl("triton_activation", x).silu_and_mul(x)


_GRAPH_KERNELS = False


@contextlib.contextmanager
def graph_kernels():
    """Within: the kernel choices for CUDA-graph capture. The engine captures its graphs and runs their warm-up
    within, so every variant compiles at start-up.
    - ``linear`` of few rows on CUDA runs ``triton_linear``'s kernel (outside: cuBLAS). Eager passes stay on cuBLAS:
      their LM head over a few sampled rows met new specializations mid-run (seven ~2 s JIT stalls in the offline
      benchmark's timed run) for a ~3% gain on a 70 us product.
    - ``paged_attention`` of a mixed batch strides over a work list with a bounded grid (outside: one program per
      tile), so a graph bucket's padding sequences cost no programs (``triton_attention.GRAPH_PROGRAMS_PER_SM``)."""
    global _GRAPH_KERNELS
    before, _GRAPH_KERNELS = _GRAPH_KERNELS, True
    try:
        yield
    finally:
        _GRAPH_KERNELS = before


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """See ``reference.linear``; see ``graph_kernels`` for when it runs Triton."""
    impl = _impl("triton_linear", x) if _GRAPH_KERNELS else reference
    return impl.linear(x, weight, bias)
