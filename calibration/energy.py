"""What a pass costs in energy: a profile's optional ``energy`` section (``calibration.profile``, from version 4).

A pass of ``seconds`` with features ``f`` (``engine.policy.plan_features``) costs

    joules = idle_w x seconds + intercept + tokens x f.num_tokens + decode_context x f.decode_context
             + prefill_attention x f.prefill_attention

the card's idle power over its time plus the energy of its work (weights read once a pass, matmuls per token, KV
bytes read per decode context token, attention per prompt token x context), and a card between passes draws
``idle_w``. The work terms are linear, so a run's energy needs only its passes' feature sums
(``run_joules``). ``calibration.sweep`` measures each pass's joules with NVML's energy counter
(``calibration.power``); ``fit_energy`` fits the coefficients on them. ``fit`` holds the provenance: the source,
how many passes, how they were measured, the fit's relative errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

VERSION = 1  # of the section's own format
FORM = "idle-plus-linear"
TERMS = ("intercept", "tokens", "decode_context", "prefill_attention")  # joules per pass, token, context token, ...
FEATURE_OF = {"tokens": "num_tokens", "decode_context": "decode_context", "prefill_attention": "prefill_attention"}
KEYS = ("version", "form", "idle_w", "coef", "power_limit_w", "fit")


def _number(name: str, value, low: float = 0.0) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= low):
        raise ValueError(f"energy {name} must be a finite number >= {low:g}, got {value!r}")
    return float(value)


class EnergyModel:
    """Joules of a pass from its time and features (see the module docstring); ``idle_w`` and ``power_limit_w``
    in watts, ``coef`` in joules per unit of each term."""

    __slots__ = ("idle_w", "coef", "power_limit_w", "fit")

    def __init__(self, idle_w: float, coef: Mapping[str, float], power_limit_w: float | None = None,
                 fit: Mapping | None = None) -> None:
        self.idle_w = _number("idle_w", idle_w)
        if not isinstance(coef, Mapping):
            raise ValueError(f"energy coef must be an object of {', '.join(TERMS)}, got {coef!r}")
        unknown = [k for k in coef if k not in TERMS]
        missing = [k for k in TERMS if k not in coef]
        if unknown or missing:
            raise ValueError(f"energy coef must have exactly the terms {', '.join(TERMS)}"
                             + (f"; unknown {unknown[0]!r}" if unknown else f"; missing {missing[0]!r}"))
        self.coef = {k: _number(f"coef.{k}", coef[k]) for k in TERMS}  # work never gives energy back: >= 0
        self.power_limit_w = None if power_limit_w is None else _number("power_limit_w", power_limit_w, 1e-9)
        if self.power_limit_w is not None and self.idle_w >= self.power_limit_w:
            raise ValueError(f"energy idle_w ({self.idle_w:g} W) must be below power_limit_w "
                             f"({self.power_limit_w:g} W)")
        self.fit = dict(fit or {})

    def work_joules(self, f) -> float:
        """The energy of a pass's work above idle power (J), for features ``f``."""
        c = self.coef
        return (c["intercept"] + c["tokens"] * f.num_tokens + c["decode_context"] * f.decode_context
                + c["prefill_attention"] * f.prefill_attention)

    def pass_joules(self, seconds: float, f) -> float:
        """The energy of one pass that takes ``seconds`` (J)."""
        return self.idle_w * seconds + self.work_joules(f)

    def run_joules(self, seconds: float, passes: int, tokens: float, decode_context: float,
                   prefill_attention: float) -> float:
        """A card's energy over ``seconds`` in which it ran ``passes`` passes with these feature sums (J): the sum
        of its passes' ``pass_joules`` and idle power between them."""
        c = self.coef
        return (self.idle_w * seconds + c["intercept"] * passes + c["tokens"] * tokens
                + c["decode_context"] * decode_context + c["prefill_attention"] * prefill_attention)

    def predict_array(self, seconds, X: Mapping[str, np.ndarray]) -> np.ndarray:
        """``pass_joules`` of many passes: ``seconds`` and feature columns ``X`` (arrays)."""
        return self.idle_w * np.asarray(seconds, dtype=float) + design(X) @ np.array([self.coef[k] for k in TERMS])

    def to_dict(self) -> dict:
        return {"version": VERSION, "form": FORM, "idle_w": self.idle_w, "coef": self.coef,
                "power_limit_w": self.power_limit_w, "fit": self.fit}

    @classmethod
    def from_dict(cls, d: Mapping) -> EnergyModel:
        if not isinstance(d, Mapping):
            raise ValueError("'energy' must be an object")
        unknown = [k for k in d if k not in KEYS]
        if unknown:
            raise ValueError(f"'energy' has an unknown key {unknown[0]!r}")
        if d.get("version") != VERSION:
            raise ValueError(f"'energy' section version {d.get('version')!r} is not supported; this code reads "
                             f"version {VERSION}")
        if d.get("form") != FORM:
            raise ValueError(f"'energy' form {d.get('form')!r} is not supported; this code reads {FORM!r}")
        for key in ("idle_w", "coef"):
            if key not in d:
                raise ValueError(f"'energy' lacks {key!r}")
        return cls(d["idle_w"], d["coef"], d.get("power_limit_w"), d.get("fit"))


def design(X: Mapping[str, np.ndarray]) -> np.ndarray:
    """One row per pass, one column per term of ``TERMS``."""
    T = np.asarray(X["num_tokens"], dtype=float)
    return np.column_stack([np.ones_like(T), *(np.asarray(X[FEATURE_OF[k]], dtype=float) for k in TERMS[1:])])


def fit_energy(X: Mapping[str, np.ndarray], seconds, joules, idle_w: float, power_limit_w: float | None = None,
               source: Mapping | None = None) -> EnergyModel:
    """Non-negative least squares on relative errors of each pass's joules, given its measured ``seconds`` and the
    card's ``idle_w``: the work terms are fitted to ``joules - idle_w x seconds``. ``source`` (where the
    measurements come from, how they were taken) goes into the model's ``fit`` with the fit's errors."""
    from scipy.optimize import lsq_linear

    seconds, joules = np.asarray(seconds, dtype=float), np.asarray(joules, dtype=float)
    if len(joules) < len(TERMS):
        raise ValueError(f"fitting the energy model needs at least {len(TERMS)} measured passes, got {len(joules)}")
    if not (np.all(np.isfinite(joules)) and np.all(joules > 0) and np.all(np.isfinite(seconds))
            and np.all(seconds > 0)):
        raise ValueError("fitting the energy model needs positive finite joules and seconds for every pass")
    A = design(X)
    scale = np.abs(A).max(axis=0)
    used = scale > 0  # a feature that is zero in every pass cannot be fitted: its coefficient stays 0
    work = joules - idle_w * seconds
    res = lsq_linear(A[:, used] / scale[used] / joules[:, None], work / joules, bounds=(0.0, np.inf))
    coef = np.zeros(len(TERMS))
    coef[used] = res.x / scale[used]
    model = EnergyModel(idle_w, dict(zip(TERMS, coef.tolist())), power_limit_w)
    rel = model.predict_array(seconds, X) / joules - 1.0
    a = np.abs(rel)
    model.fit = {**(source or {}), "passes": int(len(joules)), "unfitted_terms": [t for t, u in zip(TERMS, used)
                                                                                    if not u],
                 "median_abs_rel_err": float(np.median(a)), "max_abs_rel_err": float(a.max())}
    return model
