"""Kernels of the engine's forward pass, each as a plain-PyTorch reference and a Triton version.

- ``reference.py``: the PyTorch versions; the CPU path and the oracle of the tests.
- ``triton_attention.py``: paged KV-cache write and paged attention of a ragged mixed batch (prompt chunks and
  decodes, GQA, flash-decoding split for small decode batches).
- ``triton_norm.py``: fused residual add + RMSNorm.  ``triton_rotary.py``: rotary embedding of q and k.
- ``triton_activation.py``: fused SiLU-and-multiply of a merged gate/up projection.
- ``triton_linear.py``: linear layers of few rows (decode batches) as one weight stream, no split-K; used inside
  ``triton_linears()``, which the engine's CUDA-graph capture enters.

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
    return _impl("triton_attention", q).paged_attention(q, k_cache, v_cache, block_tables, context_lens,
                                                        query_start_loc, scale)


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


_TRITON_LINEARS = False


@contextlib.contextmanager
def triton_linears():
    """Within: ``linear`` of few rows on CUDA runs ``triton_linear``'s kernel; outside: cuBLAS. The engine captures
    its CUDA graphs (decode batches of 1-16, the 16-token bucket) and their warm-up runs within, so every variant
    compiles at start-up. Eager passes stay outside: their LM head over a few sampled rows met new specializations
    mid-run (seven ~2 s JIT stalls in the offline benchmark's timed run) for a ~3% gain on a 70 us product."""
    global _TRITON_LINEARS
    before, _TRITON_LINEARS = _TRITON_LINEARS, True
    try:
        yield
    finally:
        _TRITON_LINEARS = before


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """See ``reference.linear``; see ``triton_linears`` for when it runs Triton."""
    impl = _impl("triton_linear", x) if _TRITON_LINEARS else reference
    return impl.linear(x, weight, bias)
