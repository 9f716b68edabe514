"""The cost model: a ``BatchPlan``'s features -> predicted seconds of one engine step.

The engine runs a pass one of three ways, and each way gets its own fitted ``HingeModel``:
- ``graph``: decode-only passes (every entry one token, at most ``graph_max_batch`` of them) replay a CUDA graph;
- ``mixed``: other passes (with prompt tokens) of at most ``mixed_buckets[-1]`` tokens replay a CUDA graph
  captured at the smallest bucket >= their token count: their GEMMs (and whatever else depends only on the
  bucket) run on the padded count, so this model sees T = the bucket, while the other features stay the plan's;
- ``eager``: everything else launches its kernels one by one from Python.
Profiles measured before mixed graphs existed have no ``mixed`` model: their mixed passes are eager.

A ``HingeModel`` is
    t = max(H, G)      H = f0 + f_s * num_seqs + f_t * num_tokens                       (host floor, optional)
                       G = g(T) + a_dc * max(decode_context, k_d * decode_max_context)
                           + a_pa * max(prefill_attention, k_p * prefill_max_context)
                           + a_s * num_seqs + a_ps * prefill_seqs + a_dl * [any decode]   (device work)
``g`` is piecewise linear in the tokens per pass T (hinges max(0, T - knot)): flat-ish while the pass is bound
by reading the weights, steeper once the matrix units are the limit. ``decode_context`` (sum of decode contexts)
stands for KV bytes read, ``prefill_attention`` (sum of new tokens x context) for attention FLOPs, the
per-sequence terms for sampling, the LM head and per-sequence kernel work, ``a_dl`` for the decodes' own attention
launch beside a chunk's. The knees ``k_p`` (tokens) and ``k_d`` (sequences) are where attention stops filling the
GPU: a chunk of fewer than ``k_p`` tokens costs like ``k_p`` tokens on its context, since its few programs each read
that whole context, and a few decodes cost like ``k_d`` at their longest context (0: no knee). ``H`` is the time the
host needs to launch an eager pass: a small eager pass waits on Python, not on the GPU, and then extra device work
is hidden under the launches rather than added to them (hence a max, not a sum).

Fits minimise *relative* residuals (pass times span two orders of magnitude and the target is a relative
error): linear least squares for ``G`` alone, then ``scipy.optimize.least_squares`` for the max form; the knees are
chosen from a grid by cross-validation, as the knots are.
"""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from calibration.decode_table import DecodeTable
from engine.policy import PassFeatures

# The device model's inputs: every pass feature but the sampled entries, whose cost is the serving loop's (the
# sampling rows' LM head is in num_seqs). The longest contexts are 0 where not known (points and traces recorded
# before them): then no knee applies.
FEATURES = tuple(f for f in PassFeatures._fields if f != "num_samples")
OPTIONAL_FEATURES = ("decode_max_context", "prefill_max_context")


def with_unknown_contexts(point: Mapping) -> dict:
    """``point`` (a measured pass) with 0 (not known) for each optional feature it lacks or holds as None."""
    return {**point, **{name: 0 for name in OPTIONAL_FEATURES if point.get(name) is None}}


LINEAR_TERMS = ("decode_context", "prefill_attention", "num_seqs", "prefill_seqs", "decode_launch")
KNEES = ("prefill", "decode")
# The knees a fit may choose: tokens of a prompt chunk (a 64-query tile per program), decodes of a pass.
KNEE_CANDIDATES = {"prefill": (0, 128, 256, 384, 512, 768, 1024), "decode": (0, 1, 2, 4, 8, 16)}
KNEE_GAIN = 0.05  # the share of the cross-validated error knees must take off to be used
FLOOR_TERMS = ("floor", "floor_seqs", "floor_tokens")
# A knot at 2 tokens lets a decode graph of one sequence differ from the line through larger batches: the engine
# runs one-row linear layers through a separate kernel path (kernels/triton_linear.py), so a batch-1 step sits off
# that line (benchmarks/RESULTS.md, design decisions). Paths without passes of one token drop it.
DEFAULT_KNOTS = (2, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144)
DENSE_KNOTS = (2, 8, 16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792,
               2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168)
COARSE_KNOTS = (2, 64, 256, 1024, 4096)
CANDIDATE_KNOTS = {"coarse": COARSE_KNOTS, "default": DEFAULT_KNOTS, "dense": DENSE_KNOTS}
# Terms whose coefficient is physically non-negative (work never makes a pass faster).
NONNEGATIVE = ("intercept", "tokens", "decode_context", "prefill_attention", "decode_launch", "floor", "floor_seqs",
               "floor_tokens")


class HingeModel:
    """Fitted coefficients over a fixed knot set; ``predict_values`` is plain float math (called millions of
    times). ``floor`` is None for a model without a host floor; ``knees`` ({"prefill": tokens, "decode": sequences},
    missing ones 0) where attention stops filling the GPU."""

    __slots__ = ("knots", "coef", "floor", "knees", "_seg_base", "_seg_slope", "_dc", "_pa", "_s", "_ps", "_dl",
                 "_kp", "_kd", "_f")

    def __init__(self, knots: Sequence[float], coef: Mapping[str, float],
                 floor: Mapping[str, float] | None = None, knees: Mapping[str, float] | None = None) -> None:
        knots = [float(k) for k in knots]
        if any(b <= a for a, b in zip(knots, knots[1:])):
            raise ValueError(f"knots must be strictly increasing, got {knots}")
        missing = [n for n in term_names(knots) if n not in coef]
        if floor is not None:
            missing += [n for n in FLOOR_TERMS if n not in floor]
        if missing:
            raise ValueError(f"cost model coefficients missing: {', '.join(missing)}")
        self.knots = knots
        self.coef = {n: float(coef[n]) for n in term_names(knots)}
        self.floor = None if floor is None else {n: float(floor[n]) for n in FLOOR_TERMS}
        knees = dict(knees or {})
        unknown = sorted(set(knees) - set(KNEES))
        if unknown:
            raise ValueError(f"unknown cost model knees {', '.join(unknown)}; knees are {', '.join(KNEES)}")
        self.knees = {n: float(knees.get(n, 0.0)) for n in KNEES}
        bad = [n for n, v in {**self.coef, **(self.floor or {}), **self.knees}.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"cost model coefficients not finite: {', '.join(bad)}")
        if any(v < 0 for v in self.knees.values()):
            raise ValueError(f"cost model knees must be >= 0, got {self.knees}")
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
        self._dc, self._pa, self._s, self._ps = c["decode_context"], c["prefill_attention"], c["num_seqs"], \
            c["prefill_seqs"]
        self._dl, self._kp, self._kd = c["decode_launch"], self.knees["prefill"], self.knees["decode"]
        self._f = None if self.floor is None else tuple(self.floor[n] for n in FLOOR_TERMS)

    def predict_values(self, num_tokens, decode_context, prefill_attention, num_seqs, prefill_seqs, decode_tokens,
                       decode_max_context, prefill_max_context) -> float:
        j = bisect.bisect_right(self.knots, num_tokens)
        t = self._seg_base[j] + self._seg_slope[j] * num_tokens
        knee = self._kd * decode_max_context
        t += self._dc * (knee if knee > decode_context else decode_context)
        knee = self._kp * prefill_max_context
        t += self._pa * (knee if knee > prefill_attention else prefill_attention)
        t += self._s * num_seqs + self._ps * prefill_seqs
        if decode_tokens:
            t += self._dl
        f = self._f
        if f is not None:
            h = f[0] + f[1] * num_seqs + f[2] * num_tokens
            if h > t:
                return h
        return t

    def predict(self, f: PassFeatures) -> float:
        return self.predict_values(f.num_tokens, f.decode_context, f.prefill_attention, f.num_seqs, f.prefill_seqs,
                                   f.decode_tokens, f.decode_max_context, f.prefill_max_context)

    def attention_seconds(self, f: PassFeatures) -> float:
        """The prompt tokens' attention over their prefixes, of ``predict(f)``: the ``prefill_attention`` term."""
        knee = self._kp * f.prefill_max_context
        return self._pa * (knee if knee > f.prefill_attention else f.prefill_attention)

    def predict_array(self, X: Mapping[str, np.ndarray]) -> np.ndarray:
        t = design_matrix(X, self.knots, self.knees) @ np.array([self.coef[n] for n in term_names(self.knots)])
        if self.floor is not None:
            t = np.maximum(t, floor_matrix(X) @ np.array([self.floor[n] for n in FLOOR_TERMS]))
        return t

    def to_dict(self) -> dict:
        return {"form": "hinge-linear", "knots": self.knots, "coef": self.coef, "floor": self.floor,
                "knees": self.knees}

    @classmethod
    def from_dict(cls, d: Mapping) -> HingeModel:
        """Also reads models of profile versions before 7: no knees and no decode launch term (both 0)."""
        if not isinstance(d, Mapping) or d.get("form") != "hinge-linear":
            raise ValueError(f"cost model must be a mapping with form 'hinge-linear', got {str(d)[:80]!r}")
        coef = d["coef"]
        if isinstance(coef, Mapping) and "decode_launch" not in coef:
            coef = {**coef, "decode_launch": 0.0}
        return cls(d["knots"], coef, d.get("floor"), d.get("knees"))


class PassModel:
    """One ``HingeModel`` per execution path, chosen per pass as the engine's runner chooses. ``mixed`` (optional)
    is the mixed-graph path, taken by passes with prompt tokens of at most ``mixed_buckets[-1]`` tokens.
    ``decode_table`` (optional) predicts the decode-graph passes of the batch sizes it covers."""

    __slots__ = ("graph", "eager", "graph_max_batch", "mixed", "mixed_buckets", "decode_table", "_graph", "_eager",
                 "_mixed", "_buckets", "_table")

    def __init__(self, graph: HingeModel, eager: HingeModel, graph_max_batch: int, mixed: HingeModel | None = None,
                 mixed_buckets: Sequence[int] = (), decode_table: DecodeTable | None = None) -> None:
        self.graph, self.eager, self.graph_max_batch = graph, eager, int(graph_max_batch)
        self.mixed, self.mixed_buckets = mixed, check_buckets(mixed_buckets)
        self.decode_table = decode_table
        self._table = None if decode_table is None else decode_table.predict
        if mixed is not None and not self.mixed_buckets:
            raise ValueError("a mixed-graph model needs mixed_buckets (the token counts its graphs pad to)")
        self._graph, self._eager = graph.predict_values, eager.predict_values
        self._mixed = None if mixed is None else mixed.predict_values
        self._buckets = self.mixed_buckets if mixed is not None else []  # empty: no pass takes the mixed path

    def path(self, f: PassFeatures) -> str:
        """How the engine runs a pass of features ``f``: "decode-graph", "mixed-graph" or "eager" (the names of
        ``engine.runner.ModelRunner.path``)."""
        T, S = f.num_tokens, f.num_seqs
        if T == S <= self.graph_max_batch:
            return "decode-graph"
        b = self._buckets
        return "mixed-graph" if b and S < T <= b[-1] else "eager"

    def bucket(self, f: PassFeatures) -> int:
        """The tokens of the graph a mixed-graph pass of features ``f`` replays (its padded count); 0 for others."""
        b = self._buckets
        return b[bisect.bisect_left(b, f.num_tokens)] if b and f.num_seqs < f.num_tokens <= b[-1] else 0

    def predict(self, f: PassFeatures) -> float:
        path = self.path(f)
        if path == "decode-graph":
            if self._table is not None:
                t = self._table(f.num_seqs, f.decode_context)
                if t is not None:
                    return t
            return self._graph(f.num_tokens, f.decode_context, f.prefill_attention, f.num_seqs, f.prefill_seqs,
                               f.decode_tokens, f.decode_max_context, f.prefill_max_context)
        if path == "mixed-graph":
            return self._mixed(self.bucket(f), f.decode_context, f.prefill_attention, f.num_seqs, f.prefill_seqs,
                               f.decode_tokens, f.decode_max_context, f.prefill_max_context)
        return self._eager(f.num_tokens, f.decode_context, f.prefill_attention, f.num_seqs, f.prefill_seqs,
                           f.decode_tokens, f.decode_max_context, f.prefill_max_context)

    def attention_seconds(self, f: PassFeatures) -> float:
        """The prompt tokens' attention over their prefixes, of ``predict(f)`` (``HingeModel.attention_seconds`` of
        the path's model; 0 for decode steps)."""
        path = self.path(f)
        if path == "decode-graph":
            return 0.0
        return (self.mixed if path == "mixed-graph" else self.eager).attention_seconds(f)

    def predict_array(self, X: Mapping[str, np.ndarray]) -> np.ndarray:
        graph, mixed = path_masks(X, self.graph_max_batch, self._buckets)
        t = np.where(graph, self.graph.predict_array(X), self.eager.predict_array(X))
        if self.decode_table is not None and graph.any():
            rows = np.flatnonzero(graph)
            table = self.decode_table.predict_array(np.asarray(X["num_seqs"])[rows],
                                                    np.asarray(X["decode_context"])[rows])
            t[rows] = np.where(np.isnan(table), t[rows], table)
        if mixed.any():
            t = np.where(mixed, self.mixed.predict_array(padded(X, self._buckets)), t)
        return t

    def paths(self, X: Mapping[str, np.ndarray]) -> np.ndarray:
        """The path name ('graph', 'mixed' or 'eager') of each pass."""
        graph, mixed = path_masks(X, self.graph_max_batch, self._buckets)
        return np.where(graph, "graph", np.where(mixed, "mixed", "eager"))

    def to_dict(self) -> dict:
        d = {"form": "per-path", "graph_max_batch": self.graph_max_batch, "graph": self.graph.to_dict(),
             "eager": self.eager.to_dict()}
        if self.mixed is not None:
            d["mixed"] = self.mixed.to_dict()
        if self.mixed_buckets:
            d["mixed_buckets"] = list(self.mixed_buckets)
        if self.decode_table is not None:
            d["decode_table"] = self.decode_table.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> PassModel:
        """Also reads models without ``mixed``/``mixed_buckets`` (measured before mixed graphs): no mixed path;
        and without ``decode_table``: the hinge model predicts every decode-graph pass."""
        if not isinstance(d, Mapping) or d.get("form") != "per-path":
            raise ValueError(f"cost model must be a mapping with form 'per-path', got {str(d)[:80]!r}")
        for key in ("graph", "eager", "graph_max_batch"):
            if key not in d:
                raise ValueError(f"cost model lacks {key!r}")
        mixed = HingeModel.from_dict(d["mixed"]) if d.get("mixed") is not None else None
        table = DecodeTable.from_dict(d["decode_table"]) if d.get("decode_table") is not None else None
        return cls(HingeModel.from_dict(d["graph"]), HingeModel.from_dict(d["eager"]), d["graph_max_batch"], mixed,
                   d.get("mixed_buckets", ()), table)


def check_buckets(buckets) -> list[int]:
    """``buckets`` as a list of ints, or ValueError unless they are strictly increasing positive integers."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, (Sequence, np.ndarray)):
        raise ValueError(f"mixed_buckets must be a list of token counts, got {buckets!r}")
    if not all(isinstance(b, numbers.Integral) and not isinstance(b, bool) and b > 0 for b in buckets):
        raise ValueError(f"mixed_buckets must be positive integers, got {list(buckets)}")
    out = [int(b) for b in buckets]
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"mixed_buckets must be strictly increasing, got {out}")
    return out


def graph_mask(X: Mapping[str, np.ndarray], graph_max_batch: int) -> np.ndarray:
    T, S = np.asarray(X["num_tokens"]), np.asarray(X["num_seqs"])
    return (T == S) & (S <= graph_max_batch)


def path_masks(X: Mapping[str, np.ndarray], graph_max_batch: int, buckets: Sequence[int]) -> tuple:
    """(decode-graph mask, mixed-graph mask); the rest is eager. No buckets: no mixed-graph pass."""
    T, S = np.asarray(X["num_tokens"]), np.asarray(X["num_seqs"])
    mixed = (T > S) & (T <= buckets[-1]) if len(buckets) else np.zeros(T.shape, dtype=bool)
    return graph_mask(X, graph_max_batch), mixed


def padded(X: Mapping[str, np.ndarray], buckets: Sequence[int]) -> dict[str, np.ndarray]:
    """``X`` with ``num_tokens`` replaced by the smallest bucket >= it (the largest bucket past the last one)."""
    T = np.asarray(X["num_tokens"], dtype=float)
    b = np.asarray(buckets, dtype=float)
    return {**X, "num_tokens": b[np.minimum(np.searchsorted(b, T, side="left"), len(b) - 1)]}


def term_names(knots: Sequence[float]) -> list[str]:
    return ["intercept", "tokens", *(f"hinge_{i}" for i in range(len(knots))), *LINEAR_TERMS]


def design_matrix(X: Mapping[str, np.ndarray], knots: Sequence[float],
                  knees: Mapping[str, float] | None = None) -> np.ndarray:
    """One row per pass, one column per term of ``term_names(knots)``, the attention terms past their ``knees``."""
    knees = knees or {}
    T = np.asarray(X["num_tokens"], dtype=float)
    cols = [np.ones_like(T), T, *(np.maximum(0.0, T - k) for k in knots)]
    for name, longest, knee in (("decode_context", "decode_max_context", knees.get("decode", 0.0)),
                                ("prefill_attention", "prefill_max_context", knees.get("prefill", 0.0))):
        col = np.asarray(X[name], dtype=float)
        cols.append(np.maximum(col, knee * np.asarray(X[longest], dtype=float)) if knee else col)
    cols += [np.asarray(X["num_seqs"], dtype=float), np.asarray(X["prefill_seqs"], dtype=float),
             (np.asarray(X["decode_tokens"]) > 0).astype(float)]
    return np.column_stack(cols)


def floor_matrix(X: Mapping[str, np.ndarray]) -> np.ndarray:
    T = np.asarray(X["num_tokens"], dtype=float)
    return np.column_stack([np.ones_like(T), np.asarray(X["num_seqs"], dtype=float), T])


def supported_knots(T: np.ndarray, knots: Sequence[float], min_points: int = 2) -> list[float]:
    """The knots the data can place: at least ``min_points`` tokens counts beyond the knot, and as many in the
    segment that ends at it (a knot inside a stretch without data would bend the line there at random: e.g.
    mixed-graph passes of one sweep padded to 512 and 768 but to nothing between)."""
    kept: list[float] = []
    for k in (float(k) for k in knots):
        prev = kept[-1] if kept else -math.inf
        if ((T > k).sum() >= min_points and ((T > prev) & (T <= k)).sum() >= min_points
                and (T < k).sum() >= min_points):
            kept.append(k)
    return kept


def fit(X: Mapping[str, np.ndarray], y: np.ndarray, knots: Sequence[float] = DEFAULT_KNOTS,
        floor: bool = False, knees: Mapping[str, float] | None = None) -> HingeModel:
    """Least squares on relative residuals. Knots the data cannot place (``supported_knots``) are dropped, and
    terms the data cannot identify (a feature that is constant zero) are fixed at zero. With ``floor``, the
    max(H, G) form is fitted, starting from the linear fit of G. ``knees``: fixed, as ``HingeModel`` takes them."""
    from scipy.optimize import least_squares, lsq_linear

    y = np.asarray(y, dtype=float)
    T = np.asarray(X["num_tokens"], dtype=float)
    knots = supported_knots(T, knots)
    names = term_names(knots)
    A = design_matrix(X, knots, knees)
    scale = np.abs(A).max(axis=0)
    used = scale > 0
    A_rel = A[:, used] / scale[used] / y[:, None]
    lower = np.array([0.0 if n in NONNEGATIVE else -np.inf for n in names])[used]
    res = lsq_linear(A_rel, np.ones_like(y), bounds=(lower, np.full(lower.shape, np.inf)), method="bvls")
    coef = np.zeros(len(names))
    coef[used] = res.x / scale[used]
    if not floor:
        return HingeModel(knots, dict(zip(names, coef.tolist())), knees=knees)

    F = floor_matrix(X)
    fscale = np.abs(F).max(axis=0)
    fscale[fscale == 0] = 1.0
    Fs, Gs = F / fscale, A[:, used] / scale[used]
    n_f = Fs.shape[1]

    def parts(theta):
        return Fs @ theta[:n_f], Gs @ theta[n_f:]

    def residual(theta):
        h, g = parts(theta)
        return np.maximum(h, g) / y - 1.0

    def jac(theta):
        h, g = parts(theta)
        on_floor = (h > g)[:, None]
        return np.hstack([np.where(on_floor, Fs, 0.0), np.where(on_floor, 0.0, Gs)]) / y[:, None]

    f_lower = np.array([0.0 if n in NONNEGATIVE else -np.inf for n in FLOOR_TERMS])
    lo = np.concatenate([f_lower, lower])
    start = np.concatenate([[np.quantile(y, 0.1), 0.0, 0.0], res.x])
    start = np.clip(start, lo, np.inf)
    out = least_squares(residual, start, jac=jac, bounds=(lo, np.full(lo.shape, np.inf)), method="trf",
                        x_scale="jac", max_nfev=500, loss="soft_l1", f_scale=0.05)
    coef = np.zeros(len(names))
    coef[used] = out.x[n_f:] / scale[used]
    floor_coef = out.x[:n_f] / fscale
    return HingeModel(knots, dict(zip(names, coef.tolist())), dict(zip(FLOOR_TERMS, floor_coef.tolist())), knees)


CANDIDATES = {f"{name}{'+floor' if floor else ''}": (knots, floor)
              for name, knots in CANDIDATE_KNOTS.items() for floor in (False, True)}


def select(X: Mapping[str, np.ndarray], y: np.ndarray, candidates: Mapping[str, tuple] | None = None,
           folds: int = 5, seed: int = 0) -> tuple[str, dict, dict]:
    """The knees (``select_knees``), then the candidate (knot set, floor or not) with the smallest cross-validated
    error (``cv_score``) with those knees, on the given points, which must not include the held-out ones. Returns
    (name, scores, knees)."""
    candidates = candidates or CANDIDATES
    knees = select_knees(X, y, DEFAULT_KNOTS, folds, seed)
    scores = {name: cv_score(X, y, knots, floor, knees, folds, seed) for name, (knots, floor) in candidates.items()}
    return min(scores, key=scores.get), scores, knees


def select_knees(X: Mapping[str, np.ndarray], y: np.ndarray, knots: Sequence[float] = DEFAULT_KNOTS, folds: int = 5,
                 seed: int = 0) -> dict:
    """The knees of ``KNEE_CANDIDATES`` with the smallest cross-validated error of the linear fit over ``knots``,
    where that is ``KNEE_GAIN`` below the error without knees (else none: a knee must earn its place). A knee whose
    longest context the points never carry stays 0."""
    grids = [KNEE_CANDIDATES[name] if np.any(np.asarray(X[f"{name}_max_context"]) > 0) else (0,) for name in KNEES]
    scores = {values: cv_score(X, y, knots, False, dict(zip(KNEES, map(float, values))), folds, seed)
              for values in itertools.product(*grids)}
    best = min(scores, key=scores.get)
    none = (0,) * len(KNEES)
    if scores[best] > (1.0 - KNEE_GAIN) * scores[none]:
        best = none
    return dict(zip(KNEES, map(float, best)))


def cv_score(X: Mapping[str, np.ndarray], y: np.ndarray, knots: Sequence[float], floor: bool,
             knees: Mapping[str, float] | None, folds: int = 5, seed: int = 0) -> float:
    """median + p95 / 2 of the |relative error| of a ``folds``-fold cross-validation (folds drawn with ``seed``)."""
    y = np.asarray(y, dtype=float)
    fold = np.random.default_rng(seed).permutation(len(y)) % folds
    rel = np.empty(len(y))
    for k in range(folds):
        test = fold == k
        model = fit({n: np.asarray(v)[~test] for n, v in X.items()}, y[~test], knots, floor, knees)
        rel[test] = relative_errors(model, {n: np.asarray(v)[test] for n, v in X.items()}, y[test])
    a = np.abs(rel)
    return float(np.median(a) + np.percentile(a, 95) / 2)


def relative_errors(model, X: Mapping[str, np.ndarray], y: np.ndarray) -> np.ndarray:
    """Signed relative errors (predicted - measured) / measured."""
    y = np.asarray(y, dtype=float)
    return model.predict_array(X) / y - 1.0


def error_stats(rel: np.ndarray) -> dict:
    a = np.abs(np.asarray(rel, dtype=float))
    if a.size == 0:
        return {"n": 0, "median_abs_rel_err": None, "p95_abs_rel_err": None, "max_abs_rel_err": None}
    return {"n": int(a.size), "median_abs_rel_err": float(np.median(a)),
            "p95_abs_rel_err": float(np.percentile(a, 95)), "max_abs_rel_err": float(a.max())}
