"""Kernels of the engine's forward pass, each as a plain-PyTorch reference and a Triton version.

- ``reference.py``: the PyTorch versions; the CPU path and the oracle of the tests.
- ``triton_attention.py``: paged KV-cache write and paged attention of a ragged mixed batch (prompt chunks and
  decodes, GQA, flash-decoding split for small decode batches and long contexts).
- ``triton_norm.py``: fused residual add + RMSNorm.  ``triton_rotary.py``: rotary embedding of q and k, alone or
  with the KV-cache write of the rotated keys and the values.
- ``triton_activation.py``: fused SiLU-and-multiply of a merged gate/up projection.
- ``triton_linear.py``: linear layers of few rows (decode batches) as one weight stream, no split-K, also a merged
  gate/up projection with its SiLU in the epilogue; used inside ``graph_kernels()``, which the engine's CUDA-graph
  capture enters.
- ``triton_pdl.py``: programmatic dependent launch, with which the Triton kernels launch inside ``graph_kernels()``
  on Hopper and later.

The functions below dispatch: Triton when the tensor is on a CUDA device and triton imports, else the
reference. Triton is imported lazily, so this package imports on machines without it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib

import torch

from kernels import reference
from kernels.options import KernelOptions, kernel_options, use_kernel_options

__all__ = ["KernelOptions", "kernel_options", "use_kernel_options"]


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


def _launch(impl, x: torch.Tensor, **triton_only) -> dict:
    """Keyword arguments for ``impl``'s function: none for the reference; PDL (and ``triton_only``) for Triton."""
    return {} if impl is reference else {"pdl": _pdl(x), **triton_only}


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """See ``reference.write_kv``."""
    impl = _impl("triton_attention", k_cache)
    impl.write_kv(k, v, k_cache, v_cache, slot_mapping, **_launch(impl, k_cache))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """See ``reference.paged_attention``."""
    impl = _impl("triton_attention", q)
    return impl.paged_attention(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale,
                                **_launch(impl, q, strided=_GRAPH_KERNELS))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``reference.rms_norm``."""
    impl = _impl("triton_norm", x)
    return impl.rms_norm(x, weight, eps, residual, **_launch(impl, x))


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``reference.rotary_embedding``."""
    impl = _impl("triton_rotary", q)
    return impl.rotary_embedding(q, k, positions, cos_sin_cache, **_launch(impl, q))


def rotary_embedding_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                                  cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  slot_mapping: torch.Tensor) -> torch.Tensor:
    """``rotary_embedding`` of q and k, then ``write_kv`` of the rotated k and v; returns the rotated q. One
    Triton kernel on CUDA (one launch fewer per layer)."""
    impl = _impl("triton_rotary", q) if kernel_options().fused_rotary else reference
    if impl is reference:
        q, k = rotary_embedding(q, k, positions, cos_sin_cache)
        write_kv(k, v, k_cache, v_cache, slot_mapping)
        return q
    return impl.rotary_embedding_and_write_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                              **_launch(impl, q))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """See ``reference.silu_and_mul``."""
    impl = _impl("triton_activation", x)
    return impl.silu_and_mul(x, **_launch(impl, x))


_GRAPH_KERNELS = False


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _pdl(x: torch.Tensor) -> bool:
    """Whether a Triton kernel on ``x``'s device launches with PDL: inside ``graph_kernels()`` on Hopper or later."""
    if not (_GRAPH_KERNELS and kernel_options().pdl and x.is_cuda):
        return False
    return _pdl_capable(x.device.index if x.device.index is not None else torch.cuda.current_device())


@contextlib.contextmanager
def graph_kernels():
    """Within: the kernel choices for CUDA-graph capture. The engine captures its graphs and runs their warm-up
    within, so every variant compiles at start-up.
    - ``linear`` of few rows on CUDA runs ``triton_linear``'s kernel (outside: cuBLAS), and ``linear_silu_and_mul``
      its gated form (outside: cuBLAS, then ``silu_and_mul``). Eager passes stay on cuBLAS: their LM head over a
      few sampled rows would meet new kernel specializations mid-run, each a JIT stall far longer than the gain.
    - ``paged_attention`` of a mixed batch strides over a work list with a bounded grid (outside: one program per
      tile), so a graph bucket's padding sequences cost no programs (``KernelOptions.graph_programs_per_sm``).
    - on Hopper and later the Triton kernels launch with PDL (``triton_pdl``): in a replayed graph each kernel
      launches while the one before it drains, and the few-row linear kernel loads its first weight tile then."""
    global _GRAPH_KERNELS
    before, _GRAPH_KERNELS = _GRAPH_KERNELS, True
    try:
        yield
    finally:
        _GRAPH_KERNELS = before


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """See ``reference.linear``; see ``graph_kernels`` for when it runs Triton."""
    impl = _impl("triton_linear", x) if _GRAPH_KERNELS else reference
    return impl.linear(x, weight, bias, **_launch(impl, x))


def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """See ``reference.linear_silu_and_mul``: within ``graph_kernels`` one Triton kernel for few rows; else the
    product, then ``silu_and_mul``."""
    impl = _impl("triton_linear", x) if _GRAPH_KERNELS and kernel_options().fused_mlp else None
    if impl is None or impl is reference:
        return silu_and_mul(linear(x, weight, bias))
    return impl.linear_silu_and_mul(x, weight, bias, **_launch(impl, x))
