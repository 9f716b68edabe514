"""Cost models a simulated replica runs on: what it needs from one (``CostModel``), shipped calibration profiles,
and small analytic models for tests."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from engine.policy import PassFeatures

DEFAULT_PROFILE = "llama-2-7b"
BUILTIN = "builtin-llama-2-7b"


class CostModel(Protocol):
    """What a simulated replica needs: the KV geometry the engine gets on the card, and what a pass costs.

    ``predict`` gives the median seconds of one engine step from ``plan_features(plan)``; ``noise_factors`` maps
    a block of uniform draws in [0, 1) to multiplicative factors on those medians (the spread of measured pass
    times), one per draw, in order. The serving path, zero for a bare engine, is drawn alike:
    ``admission_seconds(prompt_tokens, uniforms)`` is the time from a client's send until the engine has a request
    (arrays, one per request), ``delivery_seconds(num_samples)`` from the end of a pass that sampled that many entries
    until the client has its tokens. ``meta`` names the model, card and kind (``calibration.profile.META_KEYS``).
    Optionally, ``new_heat()`` gives a ``calibration.serving.PrefillHeat`` (or None): a replica then keeps it, adds
    each pass to it and calls ``predict(features, heat)`` with its value when the pass starts; and
    ``greedy_seconds(features, kind, price)`` (``calibration.profile.Profile``) prices greedy passes, whose decode
    steps a replica then enqueues ahead as the engine does.
    """

    block_size: int
    num_kv_blocks: int
    max_model_len: int | None
    meta: dict

    def predict(self, features: PassFeatures) -> float: ...

    def noise_factors(self, uniforms) -> list[float]: ...

    def admission_seconds(self, prompt_tokens, uniforms): ...

    def delivery_seconds(self, num_samples: int) -> float: ...


def mean_noise_factor(cost: CostModel, draws: int = 4096) -> float:
    """The mean factor ``cost.noise_factors`` puts on a pass's predicted median: on average a simulated pass takes
    that many times its median (1 without a spread; above 1 where the spread has a longer upper tail)."""
    return float(np.mean(cost.noise_factors((np.arange(draws) + 0.5) / draws)))


@dataclass
class ConstantCost:
    """Every pass takes ``seconds`` (the M/D/1 tests); a request reaches the engine ``admission_s`` after it was
    sent, and tokens the client ``delivery_s`` after their pass."""

    seconds: float
    block_size: int = 16
    num_kv_blocks: int = 4096
    max_model_len: int | None = None
    meta: dict = field(default_factory=lambda: {"kind": "constant"})
    admission_s: float = 0.0
    delivery_s: float = 0.0

    def predict(self, features: PassFeatures) -> float:
        return self.seconds

    def admission_seconds(self, prompt_tokens, uniforms):
        return np.full(len(prompt_tokens), self.admission_s)

    def delivery_seconds(self, num_samples: int) -> float:
        return self.delivery_s

    def noise_factors(self, uniforms) -> list[float]:
        return [1.0] * len(uniforms)


@dataclass
class LinearCost:
    """t = base + per_token * tokens + per_decode_context * decode_context + per_attention * prefill_attention
    + per_seq * seqs, with optional log-normal noise of relative spread ``noise_sigma``."""

    base: float
    per_token: float
    per_decode_context: float = 0.0
    per_attention: float = 0.0
    per_seq: float = 0.0
    noise_sigma: float = 0.0
    block_size: int = 16
    num_kv_blocks: int = 4096
    max_model_len: int | None = None
    meta: dict = field(default_factory=lambda: {"kind": "linear"})

    def admission_seconds(self, prompt_tokens, uniforms):  # a bare engine's: no serving path
        return np.zeros(len(prompt_tokens))

    def delivery_seconds(self, num_samples: int) -> float:
        return 0.0

    def predict(self, f: PassFeatures) -> float:
        return (self.base + self.per_token * f.num_tokens + self.per_seq * f.num_seqs
                + self.per_decode_context * f.decode_context + self.per_attention * f.prefill_attention)

    def noise_factors(self, uniforms) -> list[float]:
        if not self.noise_sigma:
            return [1.0] * len(uniforms)
        from statistics import NormalDist

        inv_cdf, sigma = NormalDist().inv_cdf, self.noise_sigma
        return [math.exp(sigma * inv_cdf(u)) for u in uniforms.tolist()]


class SlowerHost:
    """``cost`` on a host whose passes take ``factor`` times as long: a card of the same kind that runs slower than
    the profile's typical host (the hosts of one card differ by a few percent, ``calibration/VALIDATION.md``), and
    each pass of a path in ``path_factors`` (a profile's serving paths, ``Profile.scale_path``) that many times more.
    The serving path's admission and delivery, the pass-time spread and the KV geometry stay the profile's."""

    def __init__(self, cost: CostModel, factor: float = 1.0, path_factors: Mapping[str, float] | None = None) -> None:
        path_factors = dict(path_factors or {})
        for name, value in {"": factor, **path_factors}.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                where = f" of path {name!r}" if name else ""
                raise ValueError(f"a host's pass-time factor{where} must be a positive number, got {value!r}")
        if path_factors and not hasattr(cost, "scale_path"):
            raise ValueError("factors per path need a measured profile, whose passes know their serving path")
        self.cost, self.factor, self.path_factors = cost, float(factor), path_factors
        self.source = getattr(cost, "source", None)
        self.block_size, self.num_kv_blocks = cost.block_size, cost.num_kv_blocks
        self.max_model_len = cost.max_model_len
        self.meta = {**cost.meta, "host_factor": self.factor, **({"host_path_factors": path_factors}
                                                                  if path_factors else {})}
        self.noise_factors, self.admission_seconds = cost.noise_factors, cost.admission_seconds
        self.delivery_seconds = cost.delivery_seconds
        self.energy, self.serving = getattr(cost, "energy", None), getattr(cost, "serving", None)
        self.greedy_seconds = getattr(cost, "greedy_seconds", None)

    def new_heat(self):
        return self.cost.new_heat() if hasattr(self.cost, "new_heat") else None

    def predict(self, features: PassFeatures, *heat: float) -> float:
        factor = self.factor
        if self.path_factors:
            factor *= self.path_factors.get(self.cost.scale_path(features), 1.0)
        return factor * self.cost.predict(features, *heat)


def typical_host(cost: CostModel, mix: str | None, scheduler: str | None, without: str | None = None) -> SlowerHost:
    """``cost`` on the typical measured host of its card for ``mix`` served by ``scheduler`` (e.g.
    "splitfuse-2048"): each pass ``Profile.host_typical`` times its price, the geometric mean of the overload runs
    its hosts section records (``without``: that host's runs left out, to judge it by the others)."""
    hosts = getattr(cost, "hosts", None)
    if hosts is None or not hosts.active:
        raise ValueError("a typical host needs a measured profile whose hosts section holds active runs "
                         "(splitfuse validate --record-hosts)")
    return SlowerHost(cost, cost.host_typical(mix, scheduler, without))


def builtin_llama_2_7b() -> LinearCost:
    """Llama-2-7B fp16 on one 80 GB H100, from public roofline figures, NOT measured by this project: weights
    read ~5 ms plus host ~3 ms per pass, ~30 us per token of matmuls, KV reads of 0.5 MB per context token at
    ~3 TB/s, attention at ~400 TFLOP/s; ~56 GB of KV (7,000 blocks of 16 tokens) at 0.9 memory use."""
    return LinearCost(base=8e-3, per_token=30e-6, per_decode_context=0.17e-6, per_attention=1.3e-9,
                      per_seq=20e-6, noise_sigma=0.03, block_size=16, num_kv_blocks=7000, max_model_len=4096,
                      meta={"model": "meta-llama/Llama-2-7b-hf", "card": "H100 80GB (assumed)", "dtype": "float16",
                            "tensor_parallel": 1, "kind": "builtin-table",
                            "note": "built-in roofline figures, not a measured profile"})


def load_cost_model(name: str = DEFAULT_PROFILE) -> CostModel:
    """A shipped profile by name or path (``calibration.profile.load_profile``), or ``builtin-llama-2-7b``.

    The default name falls back to the built-in figures only while no llama-2-7b profile ships.
    """
    if name == BUILTIN:
        return builtin_llama_2_7b()
    from calibration.profile import load_profile, shipped_profiles

    try:
        return load_profile(name)
    except ValueError as e:
        if name == DEFAULT_PROFILE and not any(p.startswith(name) for p in shipped_profiles()):
            return builtin_llama_2_7b()
        raise ValueError(f"--profile: {e} (or {BUILTIN!r} for built-in figures)") from None


def describe(cost: CostModel) -> str:
    """One line naming the model, card and kind of a cost model."""
    m = getattr(cost, "meta", {}) or {}
    return (f"{m.get('model', '?')} on {m.get('card', '?')} ({m.get('kind', '?')}); "
            f"{cost.num_kv_blocks} KV blocks x {cost.block_size} tokens")
