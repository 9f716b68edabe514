"""What serving adds to a profile's passes: the served engine's pass times, the serving loop's work between passes,
and the time a request and its tokens spend between the client and the engine.

A profile's pass (``calibration.sweep``) is an engine step from scheduling to the scheduler's update, timed alone.
Served, three things differ, each measured through the real server (``splitfuse validate`` traces every pass and
request; the fit uses its warm-up and overload runs, never the cells it is then judged on):
- the step itself, on a GPU that runs passes back to back with an API process beside it: ``path_scale``, per
  execution path, the median of served step time / the profile's prediction;
- the engine loop's own work before the next step (building each sampled request's output, sending them to the
  API process, taking in commands): ``per_pass_s`` + ``per_sample_s`` x sampled entries, a line through the
  traced passes whose next step followed at once;
- admission, from the client's send until the engine process has the request (HTTP, JSON, tokenizing, the pipe):
  ``admission_s`` + ``admission_per_token_s`` x prompt tokens; and delivery, from the end of the pass that made a
  token until the client has it (the pipe, detokenizing, the stream): ``delivery_s``, the median.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

PATHS = ("decode-graph", "mixed-graph", "eager")
NUMBERS = ("per_pass_s", "per_sample_s", "admission_s", "admission_per_token_s", "delivery_s")


def _check(name: str, value, low: float = 0.0) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= low):
        raise ValueError(f"serving {name} must be a finite number >= {low}, got {value!r}")
    return float(value)


class ServingModel:
    """The served engine's costs beyond a profile's passes (see the module docstring); every number in seconds."""

    __slots__ = (*NUMBERS, "path_scale", "fit")

    def __init__(self, per_pass_s: float = 0.0, per_sample_s: float = 0.0, admission_s: float = 0.0,
                 admission_per_token_s: float = 0.0, delivery_s: float = 0.0,
                 path_scale: Mapping[str, float] | None = None, fit: Mapping | None = None) -> None:
        self.per_pass_s, self.per_sample_s = _check("per_pass_s", per_pass_s), _check("per_sample_s", per_sample_s)
        self.admission_s = _check("admission_s", admission_s)
        self.admission_per_token_s = _check("admission_per_token_s", admission_per_token_s)
        self.delivery_s = _check("delivery_s", delivery_s)
        scale = dict(path_scale or {})
        unknown = [p for p in scale if p not in PATHS]
        if unknown:
            raise ValueError(f"serving path_scale: unknown path {unknown[0]!r}; paths are {', '.join(PATHS)}")
        self.path_scale = {p: _check(f"path_scale[{p}]", scale.get(p, 1.0), 1e-3) for p in PATHS}
        self.fit = dict(fit or {})

    def loop_seconds(self, num_samples: int) -> float:
        """The engine loop's work after a pass that sampled ``num_samples`` entries."""
        return self.per_pass_s + self.per_sample_s * num_samples

    def admission_seconds(self, prompt_tokens):
        """From the client's send until the engine process has the request (``prompt_tokens`` may be an array)."""
        return self.admission_s + self.admission_per_token_s * prompt_tokens

    def to_dict(self) -> dict:
        return {**{name: getattr(self, name) for name in NUMBERS}, "path_scale": self.path_scale, "fit": self.fit}

    @classmethod
    def from_dict(cls, d: Mapping) -> ServingModel:
        if not isinstance(d, Mapping):
            raise ValueError("'serving' must be an object")
        unknown = [k for k in d if k not in (*NUMBERS, "path_scale", "fit")]
        if unknown:
            raise ValueError(f"'serving' has an unknown key {unknown[0]!r}")
        return cls(**d)


def _line(x, y, name: str) -> tuple[float, float, dict]:
    """Non-negative least squares line through (x, y), on absolute values; (intercept, slope, fit summary)."""
    from scipy.optimize import lsq_linear

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(y) < 10:
        raise ValueError(f"fitting the serving {name} needs at least 10 measurements, got {len(y)}")
    A = np.column_stack([np.ones_like(x), x])
    coef = lsq_linear(A, y, bounds=(0.0, np.inf)).x
    residual = np.abs(y - A @ coef)
    return float(coef[0]), float(coef[1]), {"n": int(len(y)), "x_range": [float(x.min()), float(x.max())],
                                            "median_abs_residual_s": float(np.median(residual)),
                                            "p95_abs_residual_s": float(np.percentile(residual, 95))}


def fit_serving(passes, requests, source: Mapping | None = None) -> ServingModel:
    """A ``ServingModel`` from served measurements. ``passes``: rows (mappings or a DataFrame) with ``path``,
    ``pass_s`` (the served step), ``model_s`` (the profile's prediction of it), ``num_samples`` and ``serving_s``
    (the loop's work before the next step; NaN where the engine then idled). ``requests``: rows with
    ``prompt_tokens``, ``admission_s`` and ``delivery_s``."""
    import pandas as pd

    passes, requests = pd.DataFrame(passes), pd.DataFrame(requests)
    scale, scale_fit = {}, {}
    for path, part in passes.groupby("path"):
        ratio = (part["pass_s"] / part["model_s"]).to_numpy()
        ratio = ratio[np.isfinite(ratio)]
        if len(ratio) >= 10:
            scale[path] = float(np.median(ratio))
            scale_fit[path] = {"n": int(len(ratio)), "p10": float(np.percentile(ratio, 10)),
                               "p90": float(np.percentile(ratio, 90))}
    per_pass, per_sample, loop_fit = _line(passes["num_samples"], passes["serving_s"], "loop")
    admission, per_token, admission_fit = _line(requests["prompt_tokens"], requests["admission_s"], "admission")
    delivery = requests["delivery_s"].to_numpy(dtype=float)
    delivery = delivery[np.isfinite(delivery)]
    if len(delivery) < 10:
        raise ValueError(f"fitting the serving delivery needs at least 10 requests, got {len(delivery)}")
    fit = {"path_scale": scale_fit, "loop": loop_fit, "admission": admission_fit,
           "delivery": {"n": int(len(delivery)), "p10_s": float(np.percentile(delivery, 10)),
                        "p90_s": float(np.percentile(delivery, 90))}, **(source or {})}
    return ServingModel(per_pass, per_sample, admission, per_token, float(np.median(delivery)), scale, fit)
