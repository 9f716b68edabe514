"""``kernels.use_kernel_options``: the kernel choices benchmarks vary, checked and always restored."""

import pytest

import kernels


def test_options_apply_within_and_restore_after():
    before = kernels.kernel_options()
    with kernels.use_kernel_options(pdl=False, fused_mlp=False) as inner:
        assert kernels.kernel_options() is inner and not inner.pdl and not inner.fused_mlp
        assert inner.fused_rotary == before.fused_rotary
        with kernels.use_kernel_options(fused_mlp=True):
            assert kernels.kernel_options().fused_mlp and not kernels.kernel_options().pdl
        assert not kernels.kernel_options().fused_mlp
    assert kernels.kernel_options() is before
    with pytest.raises(RuntimeError), kernels.use_kernel_options(overlap_chunks=False):
        raise RuntimeError("a failed measurement")
    assert kernels.kernel_options() is before


@pytest.mark.parametrize("changes,match", [
    ({"fused": False}, "unknown kernel option"),
    ({"pdl": "no"}, "pdl must be True or False"),
    ({"graph_programs_per_sm": 0}, "graph_programs_per_sm must be a positive integer"),
    ({"graph_programs_per_sm": 2.5}, "graph_programs_per_sm must be a positive integer"),
    ({"mixed_decode": (100, 4, 2)}, "power of two"),
    ({"mixed_decode": (128, 4)}, "BLOCK_N, warps, stages"),
])
def test_bad_options_are_named_and_change_nothing(changes, match):
    before = kernels.kernel_options()
    with pytest.raises(ValueError, match=match), kernels.use_kernel_options(**changes):
        pass
    assert kernels.kernel_options() is before


def test_mixed_decode_given_as_a_list_is_a_tuple():
    with kernels.use_kernel_options(mixed_decode=[64, 4, 2]) as options:
        assert options.mixed_decode == (64, 4, 2)
