"""Benchmark scripts, run from the repository root as modules (``python -m benchmarks.engine_gpu``); what they share
is in ``benchmarks.common``, their latest results in ``benchmarks/results/`` and the figures in ``RESULTS.md``."""
