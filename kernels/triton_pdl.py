"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with ``launch_pdl`` may start while
the kernel before it in the stream drains, and waits (``griddepcontrol.wait``) for it to finish and flush its
memory before touching anything it wrote. Every kernel launched so must call ``wait_for_previous`` before its
first read of such data; loads of data no kernel writes (weights) may come before it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wait_for_previous(USE_PDL: tl.constexpr):
    """Wait for the previous kernel, then let the next one launch (it waits in turn). A no-op without PDL."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def launch_kwargs(pdl: bool) -> dict:
    """Launch options of a kernel launched with (or without) PDL."""
    return {"USE_PDL": pdl, "launch_pdl": True} if pdl else {"USE_PDL": False}


@triton.jit
def wait_only(USE_PDL: tl.constexpr):
    """``wait_for_previous`` without letting the next kernel launch: for a kernel with many programs whose next one
    is large too, whose programs would otherwise take SM slots (and load their first tiles) while this one streams.
    Such a kernel calls ``launch_next`` once its main loop is done."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def launch_next(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
