"""The cost model: a ``BatchPlan``'s features -> predicted seconds of one engine step.

    t = g(T) + a_dc * decode_context + a_pa * prefill_attention + a_s * num_seqs + a_ps * prefill_seqs
          + a_mix * [the pass carries prompt tokens]

``g`` is piecewise linear in the tokens per pass T (a sum of hinges max(0, T - knot)): flat-ish while the
pass is bound by reading the weights, steeper once the matrix units are the limit. ``decode_context`` (sum of
decode contexts) stands for KV bytes read, ``prefill_attention`` (sum of new tokens x context) for attention
FLOPs, the per-sequence terms for sampling, the LM head and per-sequence kernel work, and the indicator for
the different code path (eager instead of a replayed decode graph) of a pass that carries prompt tokens.

The fit is linear least squares on *relative* residuals (each row divided by its measured time), because the
target is a relative error and pass times span two orders of magnitude.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import numpy as np

FEATURES = ("num_tokens", "prefill_tokens", "decode_tokens", "num_seqs", "prefill_seqs", "decode_context",
            "prefill_attention")
LINEAR_TERMS = ("decode_context", "prefill_attention", "num_seqs", "prefill_seqs", "has_prefill")
DEFAULT_KNOTS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144)
DENSE_KNOTS = (8, 16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792,
               2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168)
COARSE_KNOTS = (64, 256, 1024, 4096)
CANDIDATE_KNOTS = {"coarse": COARSE_KNOTS, "default": DEFAULT_KNOTS, "dense": DENSE_KNOTS}
# Terms whose coefficient is physically non-negative (work never makes a pass faster).
NONNEGATIVE = ("intercept", "tokens", "decode_context", "prefill_attention")


class CostModel:
    """Fitted coefficients over a fixed knot set; ``predict`` is plain float math (called millions of times)."""

    __slots__ = ("knots", "coef", "_seg_base", "_seg_slope", "_dc", "_pa", "_s", "_ps", "_mix")

    def __init__(self, knots: Sequence[float], coef: Mapping[str, float]) -> None:
        knots = [float(k) for k in knots]
        if any(b <= a for a, b in zip(knots, knots[1:])):
            raise ValueError(f"knots must be strictly increasing, got {knots}")
        missing = [n for n in term_names(knots) if n not in coef]
        if missing:
            raise ValueError(f"cost model coefficients missing: {', '.join(missing)}")
        self.knots = knots
        self.coef = {n: float(coef[n]) for n in term_names(knots)}
        bad = [n for n, v in self.coef.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"cost model coefficients not finite: {', '.join(bad)}")
        # g(T) on segment j (knots[j-1] <= T < knots[j]) is base[j] + slope[j] * T.
        base, slope = self.coef["intercept"], self.coef["tokens"]
        self._seg_base, self._seg_slope = [base], [slope]
        for i, k in enumerate(knots):
            b = self.coef[f"hinge_{i}"]
            base -= b * k
            slope += b
            self._seg_base.append(base)
            self._seg_slope.append(slope)
        c = self.coef
        self._dc, self._pa = c["decode_context"], c["prefill_attention"]
        self._s, self._ps, self._mix = c["num_seqs"], c["prefill_seqs"], c["has_prefill"]

    def predict_values(self, num_tokens: float, decode_context: float, prefill_attention: float,
                       num_seqs: float, prefill_seqs: float, prefill_tokens: float) -> float:
        j = bisect.bisect_right(self.knots, num_tokens)
        t = self._seg_base[j] + self._seg_slope[j] * num_tokens
        t += self._dc * decode_context + self._pa * prefill_attention + self._s * num_seqs
        t += self._ps * prefill_seqs
        if prefill_tokens:
            t += self._mix
        return t

    def predict(self, f: Mapping[str, float]) -> float:
        return self.predict_values(f["num_tokens"], f["decode_context"], f["prefill_attention"], f["num_seqs"],
                                   f["prefill_seqs"], f["prefill_tokens"])

    def predict_array(self, X: Mapping[str, np.ndarray]) -> np.ndarray:
        names = term_names(self.knots)
        return design_matrix(X, self.knots) @ np.array([self.coef[n] for n in names])

    def to_dict(self) -> dict:
        return {"form": "hinge-linear", "knots": self.knots, "coef": self.coef}

    @classmethod
    def from_dict(cls, d: Mapping) -> CostModel:
        if not isinstance(d, Mapping) or d.get("form") != "hinge-linear":
            raise ValueError(f"cost model must be a mapping with form 'hinge-linear', got {str(d)[:80]!r}")
        return cls(d["knots"], d["coef"])


def term_names(knots: Sequence[float]) -> list[str]:
    return ["intercept", "tokens", *(f"hinge_{i}" for i in range(len(knots))), *LINEAR_TERMS]


def design_matrix(X: Mapping[str, np.ndarray], knots: Sequence[float]) -> np.ndarray:
    """One row per pass, one column per term of ``term_names(knots)``."""
    T = np.asarray(X["num_tokens"], dtype=float)
    cols = [np.ones_like(T), T, *(np.maximum(0.0, T - k) for k in knots)]
    cols += [np.asarray(X[n], dtype=float) for n in LINEAR_TERMS[:-1]]
    cols.append((np.asarray(X["prefill_tokens"], dtype=float) > 0).astype(float))
    return np.column_stack(cols)


def fit(X: Mapping[str, np.ndarray], y: np.ndarray, knots: Sequence[float] = DEFAULT_KNOTS) -> CostModel:
    """Least squares on relative residuals; knots beyond the data (or with no data past them) are dropped,
    and terms the data cannot identify (a feature that is constant zero) are fixed at zero."""
    from scipy.optimize import lsq_linear

    y = np.asarray(y, dtype=float)
    T = np.asarray(X["num_tokens"], dtype=float)
    knots = [float(k) for k in knots if (T > k).sum() >= 2 and (T < k).sum() >= 2]
    names = term_names(knots)
    A = design_matrix(X, knots)
    scale = np.abs(A).max(axis=0)
    used = scale > 0
    A_rel = A[:, used] / scale[used] / y[:, None]
    lower = np.array([0.0 if n in NONNEGATIVE else -np.inf for n in names])[used]
    res = lsq_linear(A_rel, np.ones_like(y), bounds=(lower, np.full(lower.shape, np.inf)), method="bvls")
    coef = np.zeros(len(names))
    coef[used] = res.x / scale[used]
    return CostModel(knots, dict(zip(names, coef.tolist())))


def select_knots(X: Mapping[str, np.ndarray], y: np.ndarray, candidates: Mapping[str, Sequence[float]] = None,
                 folds: int = 5, seed: int = 0) -> tuple[str, dict]:
    """The knot set with the smallest cross-validated error (median + p95 / 2 of |relative error|) on the given
    points, which must not include the held-out ones. Returns (name, {name: score})."""
    candidates = candidates or CANDIDATE_KNOTS
    y = np.asarray(y, dtype=float)
    fold = np.random.default_rng(seed).permutation(len(y)) % folds
    scores = {}
    for name, knots in candidates.items():
        rel = np.empty(len(y))
        for k in range(folds):
            test = fold == k
            train = {n: np.asarray(v)[~test] for n, v in X.items()}
            model = fit(train, y[~test], knots)
            rel[test] = relative_errors(model, {n: np.asarray(v)[test] for n, v in X.items()}, y[test])
        a = np.abs(rel)
        scores[name] = float(np.median(a) + np.percentile(a, 95) / 2)
    return min(scores, key=scores.get), scores


def relative_errors(model: CostModel, X: Mapping[str, np.ndarray], y: np.ndarray) -> np.ndarray:
    """Signed relative errors (predicted - measured) / measured."""
    y = np.asarray(y, dtype=float)
    return model.predict_array(X) / y - 1.0


def error_stats(rel: np.ndarray) -> dict:
    a = np.abs(np.asarray(rel, dtype=float))
    if a.size == 0:
        return {"n": 0, "median_abs_rel_err": None, "p95_abs_rel_err": None, "max_abs_rel_err": None}
    return {"n": int(a.size), "median_abs_rel_err": float(np.median(a)),
            "p95_abs_rel_err": float(np.percentile(a, 95)), "max_abs_rel_err": float(a.max())}
