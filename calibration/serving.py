"""What the serving loop adds to each pass, beyond what a profile's sweep times.

A profile's pass (``calibration.sweep``) spans an engine step from scheduling to the scheduler's update. The server's
engine loop (``engine.server.engine_core``) does more before the next pass can start: it builds an output for every
request that sampled a token, sends them to the API process, takes in the commands that came meanwhile. Measured
through that very loop under a served workload (``splitfuse validate`` traces it, pass by pass: ``serving_s``, from
the update to the next step's start, where the next step followed at once), the work grows with the outputs of the
pass, and a profile keeps a line through it: seconds = ``per_pass_s`` + ``per_sample_s`` x samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

KEYS = ("per_pass_s", "per_sample_s")


class ServingModel:
    """The serving loop's seconds per pass: ``per_pass_s`` + ``per_sample_s`` x the pass's sampled entries."""

    __slots__ = ("per_pass_s", "per_sample_s", "fit")

    def __init__(self, per_pass_s: float, per_sample_s: float, fit: Mapping | None = None) -> None:
        for name, value in (("per_pass_s", per_pass_s), ("per_sample_s", per_sample_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"serving {name} must be a finite number >= 0, got {value!r}")
        self.per_pass_s, self.per_sample_s = float(per_pass_s), float(per_sample_s)
        self.fit = dict(fit or {})

    def seconds(self, num_samples: int) -> float:
        return self.per_pass_s + self.per_sample_s * num_samples

    def to_dict(self) -> dict:
        return {"per_pass_s": self.per_pass_s, "per_sample_s": self.per_sample_s, "fit": self.fit}

    @classmethod
    def from_dict(cls, d: Mapping) -> ServingModel:
        if not isinstance(d, Mapping) or any(k not in d for k in KEYS):
            raise ValueError(f"'serving' must be an object with {', '.join(KEYS)}")
        return cls(d["per_pass_s"], d["per_sample_s"], d.get("fit"))


def fit_serving(num_samples, serving_s, source: Mapping | None = None) -> ServingModel:
    """The least-squares line (non-negative, on absolute seconds) through traced passes' serving time against their
    sampled entries; ``fit`` records how many passes, the residuals and ``source`` (what was served, where)."""
    from scipy.optimize import lsq_linear

    x, y = np.asarray(num_samples, dtype=float), np.asarray(serving_s, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(y) < 10:
        raise ValueError(f"fitting the serving loop needs at least 10 traced passes, got {len(y)}")
    A = np.column_stack([np.ones_like(x), x])
    coef = lsq_linear(A, y, bounds=(0.0, np.inf)).x
    residual = y - A @ coef
    return ServingModel(float(coef[0]), float(coef[1]), {
        "passes": int(len(y)), "samples_range": [float(x.min()), float(x.max())],
        "median_abs_residual_s": float(np.median(np.abs(residual))),
        "p95_abs_residual_s": float(np.percentile(np.abs(residual), 95)), **(source or {})})
