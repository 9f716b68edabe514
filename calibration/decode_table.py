"""The decode-graph table: a decode step's seconds per batch size, a line in the batch's summed context.

A CUDA-graph decode step's time does not follow one line through batch sizes: a batch runs in its graph's padded
bucket, and the attention kernel's programs (sequences x KV heads) fill the SMs in waves, so one sequence more can
add a wave (on an H200, llama-2-7b: 17 sequences at 2,700 tokens take 24% longer than 16). The table keeps, per
measured batch size ``n``, ``t = intercept[n] + slope[n] * decode_context``, fitted on decode batches whose contexts
are spread 0.5-1.5x around their mean as a served batch's are (``calibration.plans.decode_table_specs``); a size
between two measured ones is interpolated at the same mean context, and a size outside them is left to the hinge
model (``predict`` answers None).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import numpy as np


class DecodeTable:
    __slots__ = ("seqs", "intercept", "slope")

    def __init__(self, seqs: Sequence[int], intercept: Sequence[float], slope: Sequence[float]) -> None:
        seqs = [int(n) for n in seqs]
        if not seqs or len(intercept) != len(seqs) or len(slope) != len(seqs):
            raise ValueError(f"a decode table needs one intercept and one slope per batch size; got {len(seqs)} "
                             f"sizes, {len(intercept)} intercepts, {len(slope)} slopes")
        if seqs[0] < 1 or any(b <= a for a, b in zip(seqs, seqs[1:])):
            raise ValueError(f"decode table batch sizes must be increasing positive integers, got {seqs[:8]}...")
        values = [float(x) for x in (*intercept, *slope)]
        if not all(math.isfinite(x) for x in values) or min(float(s) for s in slope) < 0:
            raise ValueError("decode table coefficients must be finite and its slopes non-negative")
        self.seqs = seqs
        self.intercept = [float(x) for x in intercept]
        self.slope = [float(x) for x in slope]

    def predict(self, num_seqs: int, decode_context: float) -> float | None:
        """Seconds of a decode step of ``num_seqs`` sequences attending ``decode_context`` tokens in all; None
        outside the measured sizes."""
        seqs = self.seqs
        if not seqs[0] <= num_seqs <= seqs[-1]:
            return None
        j = bisect.bisect_left(seqs, num_seqs)
        if seqs[j] == num_seqs:
            return self.intercept[j] + self.slope[j] * decode_context
        lo, hi = seqs[j - 1], seqs[j]
        mean = decode_context / num_seqs
        t_lo = self.intercept[j - 1] + self.slope[j - 1] * mean * lo
        t_hi = self.intercept[j] + self.slope[j] * mean * hi
        return t_lo + (t_hi - t_lo) * (num_seqs - lo) / (hi - lo)

    def predict_array(self, num_seqs: np.ndarray, decode_context: np.ndarray) -> np.ndarray:
        """``predict`` per row; NaN outside the measured sizes."""
        return np.array([np.nan if (t := self.predict(int(n), float(c))) is None else t
                         for n, c in zip(num_seqs, decode_context)])

    def to_dict(self) -> dict:
        return {"seqs": self.seqs, "intercept": self.intercept, "slope": self.slope}

    @classmethod
    def from_dict(cls, d: Mapping) -> DecodeTable:
        if not isinstance(d, Mapping) or not {"seqs", "intercept", "slope"} <= set(d):
            raise ValueError(f"decode_table must be a mapping of seqs, intercept and slope, got {str(d)[:80]!r}")
        return cls(d["seqs"], d["intercept"], d["slope"])


def fit_decode_table(num_seqs: np.ndarray, decode_context: np.ndarray, seconds: np.ndarray,
                     min_points: int = 2, min_span: float = 3.0) -> DecodeTable | None:
    """Per batch size with at least ``min_points`` points whose contexts span a factor ``min_span`` (two close
    contexts would make the slope out of noise), the line through them by least squares on relative residuals
    (slope >= 0); None when no size has enough. Sizes left out are interpolated from their neighbours."""
    from scipy.optimize import lsq_linear

    num_seqs, decode_context = np.asarray(num_seqs, dtype=int), np.asarray(decode_context, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    rows = []
    for n in np.unique(num_seqs):
        mask = num_seqs == n
        c, y = decode_context[mask], seconds[mask]
        if mask.sum() < min_points or c.max() < min_span * c.min():
            continue
        A = np.column_stack([np.ones_like(c), c]) / y[:, None]
        coef = lsq_linear(A, np.ones_like(y), bounds=([-np.inf, 0.0], [np.inf, np.inf])).x
        rows.append((int(n), float(coef[0]), float(coef[1])))
    if not rows:
        return None
    seqs, intercept, slope = zip(*rows)
    return DecodeTable(seqs, intercept, slope)
