"""A profile: one versioned JSON file with the measured passes of one (model, card, dtype, parallelism), the
fitted cost model, the spread of pass times, the KV capacity the engine gets on that card, (from version 3)
what the serving loop adds to each pass (``calibration.serving``), (from version 4) the energy of each pass
(``calibration.energy``), (from version 6) a decode table in the cost model (``calibration.decode_table``), (from
version 7) knees in its attention terms, (from version 8) the card's heat in the serving section, (from version
9) a knee in its loop, (from version 10) a scale of its own for eager passes of prompts alone, (from version 11)
how the card's measured hosts differ from it (``calibration.host_spread``), (from version 12) a scale of its own
for graph passes of prompts alone, (from version 13) a scale of the served prompt attention and (from version 15)
the served passes' spread, (from version 16) the served step's work per sampled entry and (from version 17) greedy
passes (from version 18 at their price less what they save, a line in their sampled entries), (from version
19) a factor per mixed-graph bucket, (from version 20) what a sampled pass saves since the sweep, where the
engine's sampler changed (``calibration.sampler_saved``), and (from version 21) what a graph step saves past a
knee in its sampled entries. All are optional, and files of versions 2 to 20 still load (but for version 17's
greedy section, which is refused, named).

Loading validates every number: all finite, knots and buckets strictly increasing, work coefficients, noise
factors and measured times in range, and the model's predictions positive, so that a damaged file fails with the
field it names instead of simulating NaNs. Torch-free and cheap to import: the simulator loads profiles and calls
``predict`` millions of times.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from calibration.cost_model import (
    FEATURES,
    FLOOR_TERMS,
    NONNEGATIVE,
    OPTIONAL_FEATURES,
    PassModel,
    with_unknown_contexts,
)
from calibration.energy import EnergyModel
from calibration.host_spread import CardSpread, HostSpread
from calibration.serving import GRAPH_PATHS, PrefillHeat, ServingModel, scale_path
from engine.policy import PassFeatures

FORMAT = "splitfuse-profile"
# 3: an optional "serving" section; 4: an optional "energy" section; 5: the serving section's delivery grows with a
# pass's sampled entries; 6: the cost model may hold a decode table (``calibration.decode_table``); 7: each path's
# model has knees and a decode launch term, and points carry the longest decode and chunk contexts; 8: the serving
# section's path scales may grow with the card's heat (``calibration.serving.PrefillHeat``); 9: the serving loop's
# work may grow faster per sampled entry past a knee; 10: eager passes of prompts alone may have a scale of their
# own ("eager-prefill"); 11: an optional "hosts" section, the measured hosts' capacity against this profile
# (``calibration.host_spread``); 12: graph passes of prompts alone may have a scale of their own ("mixed-prefill");
# 13: the serving section's paths may grow their prompt attention ("attention_scale"); 14: passes with prompt
# tokens may pay for their decodes' spread of contexts (the serving section's "mixed_spread_s"); 15: the serving
# section may carry the served passes' spread ("noise_q"), which the simulator then draws from; 16: the serving
# section's served step may grow per sampled entry beyond the sweep's price ("step_per_sample_s"); 17, 18: greedy
# passes (``calibration.serving``); 19: a factor per mixed-graph bucket on the serving section's scale
# ("bucket_scale"); 20: what a sampled pass saves since the sweep, by its kind and sampled entries ("sampler_saved");
# 21: what a graph step saves past a knee in its sampled entries ("step_knee", "step_saved_past_knee"); 22: a
# measured host's run may carry its overload run, to simulate again ("run"), and be retired ("retired").
# Versions 2-15 are read too (no knees, no launch term; points without the longest contexts hold 0 for them, not
# known; no heat; a loop of one line; prompts alone at the eager or mixed path's scale; no attention scale; no
# spread charged beside prompt tokens; the sweep's spread of pass times; no work per sampled entry in the step).
VERSION = 22
READS = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22)
PROFILES_DIR = Path(__file__).parent / "profiles"
META_KEYS = ("model", "card", "dtype", "tensor_parallel", "kind")


class Profile:
    """Fitted cost model plus what the simulator must copy from the engine (block size, KV blocks, context)."""

    def __init__(self, meta: Mapping, block_size: int, num_kv_blocks: int, max_model_len: int, model: PassModel,
                 *, points: list[dict] | None = None, noise: list[float] | None = None,
                 fit: Mapping | None = None, serving: ServingModel | None = None,
                 energy: EnergyModel | None = None, hosts: HostSpread | None = None) -> None:
        self.meta = dict(meta)
        self.block_size = int(block_size)
        self.num_kv_blocks = int(num_kv_blocks)
        self.max_model_len = int(max_model_len)
        self.model = model
        self.points = points or []
        self.noise = sorted(float(x) for x in (noise or []))
        self.fit = dict(fit or {})
        self.serving = serving
        self.energy = energy  # None: the profile has no energy figures (the simulator reports NaN energy)
        self.hosts = hosts  # None: no host of the card measured against it
        self.source: str | None = None  # the file it was loaded from
        if serving is None:  # the fitted model's own method answers (one call less on the simulator's hot path)
            self.predict = model.predict
        if serving is None or serving.greedy is None:  # a simulated replica then asks nothing per pass
            self.greedy_seconds = None
        self._noise = None  # the noise as a numpy array, made on first use

    def __repr__(self) -> str:
        m = self.meta
        return (f"Profile({m.get('model')!r}, card={m.get('card')!r}, {m.get('dtype')}, kind={m.get('kind')!r}, "
                f"{self.num_kv_blocks} KV blocks of {self.block_size})")

    # -- prediction (the simulator's hot path) ---------------------------------------------------------------
    def predict(self, f: PassFeatures, heat: float = 0.0) -> float:
        """Median seconds of one pass with features ``f`` (``plan_features(plan)``): the engine step as the sweep
        timed it, or, where the profile has its serving section, as the server runs it, with the serving loop's
        work until the next step, on a card of that ``heat`` (``new_heat``), less what its sampling saves since the
        sweep (``sampler_saved_seconds``)."""
        serving = self.serving
        path = self.scale_path(f)
        step = self.model.predict(f)
        attention = serving.attention_scale[path]
        if attention:
            step += attention * self.model.attention_seconds(f)
        bucket = self.model.bucket(f) if serving.bucket_scale else 0
        return (serving.step_seconds(path, step, f.num_samples, heat, bucket) + serving.loop_seconds(f.num_samples)
                + serving.spread_seconds(f) - serving.sampler_saved_seconds(f.num_samples, f.prefill_tokens))

    def greedy_seconds(self, f: PassFeatures, kind: str, price: float) -> float | None:
        """What a served pass of features ``f`` whose entries all take their argmax takes, priced ``price`` seconds
        as a sampled one (``predict(f)``, or a host's share of it), as it runs (``ServingModel.greedy_seconds``): a
        graph pass that samples takes its argmax inside the graph ("step"), and only a decode-graph step runs ahead
        ("ahead", "discarded"). None for any other pass. None itself where the profile measured no greedy serving
        (the simulator then prices such passes as sampled ones, and enqueues nothing ahead). A greedy pass never ran
        the sampler, so what sampling saves since the sweep is added back to ``price`` first."""
        path = self.model.path(f)
        if not f.num_samples or path not in GRAPH_PATHS or (kind != "step" and path != "decode-graph"):
            return None
        price += self.serving.sampler_saved_seconds(f.num_samples, f.prefill_tokens)
        return self.serving.greedy_seconds(kind, price, f.num_samples)

    def attention_seconds(self, f: PassFeatures) -> float:
        """The swept price of the prompt tokens' attention over their prefixes in a pass with features ``f``
        (``PassModel.attention_seconds``), which the serving section's ``attention_scale`` grows."""
        return self.model.attention_seconds(f)

    def scale_path(self, f: PassFeatures) -> str:
        """The serving section's path of a pass with features ``f`` (``calibration.serving.scale_path``)."""
        return scale_path(self.model.path(f), f.decode_tokens)

    def new_heat(self) -> PrefillHeat | None:
        """A fresh ``PrefillHeat`` of the card (what a simulated replica keeps and passes to ``predict``), or None
        where no pass's time depends on it."""
        serving = self.serving
        return PrefillHeat(serving.heat_tau_s) if serving is not None and serving.heats else None

    def admission_seconds(self, prompt_tokens, uniforms):
        """From a client's send until the engine has the request, per prompt length and uniform draw (0 without a
        serving section)."""
        if self.serving is None:
            return np.zeros(len(prompt_tokens))
        return self.serving.admission_seconds(prompt_tokens, uniforms)

    def delivery_seconds(self, num_samples: int) -> float:
        """From the end of a pass that sampled ``num_samples`` entries until the client has its tokens (0 without a
        serving section)."""
        return 0.0 if self.serving is None else self.serving.delivery_seconds(num_samples)

    def noise_factors(self, uniforms) -> list[float]:
        """Multiplicative noise on predicted medians, drawn from the measured spread of pass times: the served
        passes' (the serving section's ``noise_q``) where the profile has it, else the sweep's repeats
        (``noise``). The factor for a uniform draw ``u`` in [0, 1) is ``noise[int(u * len(noise))]`` (1 without a
        measured spread)."""
        if self._noise is None:
            served = self.serving.noise_q if self.serving is not None else ()
            self._noise = np.asarray(served if len(served) else self.noise)
        n = len(self._noise)
        if not n:
            return [1.0] * len(uniforms)
        return self._noise[(uniforms * n).astype(np.int64)].tolist()

    def with_serving(self, serving: ServingModel | None) -> Profile:
        """This profile with ``serving`` as its serving loop's cost per pass."""
        return Profile(self.meta, self.block_size, self.num_kv_blocks, self.max_model_len, self.model,
                       points=self.points, noise=self.noise, fit=self.fit, serving=serving, energy=self.energy,
                       hosts=self.hosts if serving is self.serving else None)

    def with_energy(self, energy: EnergyModel | None) -> Profile:
        """This profile with ``energy`` as the energy of its passes."""
        profile = self.with_serving(self.serving)
        profile.energy = energy
        return profile

    def with_hosts(self, hosts: HostSpread | None) -> Profile:
        """This profile with ``hosts`` as its measured hosts."""
        profile = self.with_serving(self.serving)
        profile.hosts = hosts
        return profile

    def host_margin(self, mix: str | None = None, scheduler: str | None = None) -> float:
        """How much slower than this profile a host of its card may run ``mix`` served by ``scheduler`` (its name
        and token budget, e.g. "splitfuse-512"; ``HostSpread.margin`` with the card's spread, ``card_spread``; 0
        where no host was measured against it)."""
        return self.hosts.margin(mix, self.card_spread(), scheduler=scheduler) if self.hosts is not None else 0.0

    def host_typical(self, mix: str | None = None, scheduler: str | None = None, without: str | None = None) -> float:
        """The pass-time factor of a typical host of its card on ``mix`` served by ``scheduler``: the geometric mean
        of the measured runs ``host_margin`` reads (``HostSpread.typical``; 1 where no host was measured against
        it); ``without``: that host's runs left out."""
        return self.hosts.typical(mix, scheduler, without) if self.hosts is not None else 1.0

    def card_spread(self) -> CardSpread | None:
        """Its card's hosts' spread, pooled over its own hosts and those of the shipped profiles of its card and
        other models."""
        if self.hosts is None:
            return None
        card, model = self.meta.get("card"), self.meta.get("model")
        others = [hosts for other_card, other_model, hosts in _shipped_hosts()
                  if other_card == card and other_model != model]
        return CardSpread.pooled([self.hosts, *others])

    # -- persistence -------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        columns = sorted({k for p in self.points for k in p})
        return {
            "format": FORMAT,
            "version": VERSION,
            "meta": self.meta,
            "block_size": self.block_size,
            "num_kv_blocks": self.num_kv_blocks,
            "max_model_len": self.max_model_len,
            "cost_model": self.model.to_dict(),
            "fit": self.fit,
            "noise": self.noise,
            **({"serving": self.serving.to_dict()} if self.serving is not None else {}),
            **({"energy": self.energy.to_dict()} if self.energy is not None else {}),
            **({"hosts": self.hosts.to_dict()} if self.hosts is not None else {}),
            "points": {"columns": columns, "rows": [[p.get(c) for c in columns] for p in self.points]},
        }

    def save(self, path: str | Path) -> Path:
        """Write the profile; ValueError (and no file) if it would not load back, e.g. a fit on too few or too
        noisy points that predicts a pass of negative time."""
        path = Path(path)
        d = self.to_dict()
        Profile.from_dict(d, source=str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(d, indent=1, allow_nan=False) + "\n")
        return path

    @classmethod
    def from_dict(cls, d, source: str = "profile") -> Profile:
        def bad(problem: str) -> ValueError:
            return ValueError(f"{source}: not a valid {FORMAT} file: {problem}")

        if not isinstance(d, dict):
            raise bad(f"expected a JSON object at the top, got {type(d).__name__}")
        where, value = _first_non_finite(d)
        if where is not None:
            raise bad(f"{where} is {value!r}; every number in a profile must be finite")
        if d.get("format") != FORMAT:
            raise bad(f"'format' is {d.get('format')!r}, expected {FORMAT!r}")
        if d.get("version") not in READS:
            raise ValueError(f"{source}: profile version {d.get('version')!r} is not supported; this code reads "
                             f"versions {', '.join(map(str, READS))} (re-run `splitfuse profile` or refit the points)")
        for key in ("meta", "block_size", "num_kv_blocks", "max_model_len", "cost_model"):
            if key not in d:
                raise bad(f"missing key {key!r}")
        meta = d["meta"]
        if not isinstance(meta, dict):
            raise bad("'meta' must be an object")
        missing = [k for k in META_KEYS if k not in meta]
        if missing:
            raise bad(f"'meta' lacks {', '.join(missing)}")
        for key in ("block_size", "num_kv_blocks", "max_model_len"):
            v = d[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(f"{key!r} must be a positive integer, got {v!r}")
        try:
            model = PassModel.from_dict(d["cost_model"])
        except (ValueError, KeyError, TypeError) as e:
            raise bad(f"'cost_model': {e}") from None
        _check_model_ranges(model, bad)
        noise = d.get("noise", [])
        if not isinstance(noise, list) or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0
                                                  for x in noise):
            raise bad("'noise' must be a list of positive numbers")
        points = _points_from(d.get("points", {"columns": [], "rows": []}), bad)
        _check_predictions(model, points, d["max_model_len"], bad)
        return cls(meta, d["block_size"], d["num_kv_blocks"], d["max_model_len"], model, points=points,
                   noise=noise, fit=d.get("fit") or {}, serving=_section(d, "serving", ServingModel, bad),
                   energy=_section(d, "energy", EnergyModel, bad), hosts=_section(d, "hosts", HostSpread, bad))


def _section(d: dict, key: str, cls, bad):
    """The optional section ``d[key]`` read by ``cls.from_dict`` (None where absent); its errors name the file."""
    if d.get(key) is None:
        return None
    try:
        return cls.from_dict(d[key])
    except ValueError as e:
        raise bad(str(e)) from None


def _first_non_finite(value, where: str = "") -> tuple[str | None, object]:
    """The path (``cost_model.graph.knots[3]``) and value of the first NaN or infinite number in ``value``."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the file", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_non_finite(item, f"{where}[{key}]" if isinstance(key, int) else
                                  f"{where}.{key}" if where else str(key))
        if found[0] is not None:
            return found
    return None, None


def _check_model_ranges(model: PassModel, bad) -> None:
    """Knots inside the token range, coefficients of work non-negative, a decode-graph batch >= 0."""
    if model.graph_max_batch < 0:
        raise bad(f"cost_model.graph_max_batch must be >= 0, got {model.graph_max_batch}")
    for path in ("graph", "eager", "mixed"):
        hinge = getattr(model, path)
        if hinge is None:
            continue
        if hinge.knots and hinge.knots[0] <= 0:
            raise bad(f"cost_model.{path}.knots must be positive token counts, got {hinge.knots[0]}")
        for name, v in {**hinge.coef, **(hinge.floor or {})}.items():
            if name in NONNEGATIVE and v < 0:
                where = "floor" if name in FLOOR_TERMS else "coef"
                raise bad(f"cost_model.{path}.{where}.{name} is {v}, but work never makes a pass faster (>= 0)")


def _check_predictions(model: PassModel, points: list[dict], max_model_len: int, bad) -> None:
    """Every measured point's time positive, and the model's prediction positive for it, for a one-token decode
    and for a prompt of the whole context."""
    for i, p in enumerate(points):
        for name in FEATURES:
            if not isinstance(p[name], (int, float)) or isinstance(p[name], bool) or p[name] < 0:
                raise bad(f"points row {i}: {name} must be a number >= 0, got {p[name]!r}")
        if not isinstance(p.get("wall_s"), (int, float)) or not p["wall_s"] > 0:
            raise bad(f"points row {i}: wall_s must be a time > 0 s, got {p.get('wall_s')!r}")
    n = max_model_len
    probes = [PassFeatures(num_tokens=1, prefill_tokens=0, decode_tokens=1, num_seqs=1, prefill_seqs=0,
                           decode_context=1, prefill_attention=0, num_samples=1),
              PassFeatures(num_tokens=n, prefill_tokens=n, decode_tokens=0, num_seqs=1, prefill_seqs=1,
                           decode_context=0, prefill_attention=n * (n + 1) // 2, num_samples=1)]
    probes += [point_features(p) for p in points]
    for f in probes:
        t = model.predict(f)
        if not (math.isfinite(t) and t > 0):
            raise bad(f"the cost model predicts {t!r} s for a pass of {f.num_tokens} tokens in {f.num_seqs} "
                      "sequences; a pass must take a positive time")


def point_features(point: Mapping) -> PassFeatures:
    """A measured point's pass features. Points swept before passes counted their sampled entries have no
    ``num_samples`` (None where a profile holds them beside newer points): every sequence is taken to sample
    (only a serving section's loop cost reads it). Those swept before passes carried their longest decode or chunk
    context have none (or None): 0, not known."""
    point = with_unknown_contexts(point)
    if point.get("num_samples") is None:
        point["num_samples"] = point["num_seqs"]
    return PassFeatures.from_mapping(point)


def _points_from(p, bad) -> list[dict]:
    if not isinstance(p, dict) or not isinstance(p.get("columns"), list) or not isinstance(p.get("rows"), list):
        raise bad("'points' must be an object with 'columns' and 'rows' lists")
    columns = p["columns"]
    if p["rows"]:
        absent = [f for f in FEATURES if f not in columns and f not in OPTIONAL_FEATURES]
        if absent:
            raise bad(f"'points' lacks the feature columns {', '.join(absent)}")
    for i, row in enumerate(p["rows"]):
        if not isinstance(row, list) or len(row) != len(columns):
            raise bad(f"points row {i} has {len(row) if isinstance(row, list) else '?'} values for "
                      f"{len(columns)} columns")
    # swept before the longest contexts were recorded: 0, not known
    return [with_unknown_contexts(dict(zip(columns, row))) for row in p["rows"]]


@functools.cache
def _shipped_hosts() -> tuple[tuple[str, str, HostSpread], ...]:
    """(card, model, hosts) of each shipped measured profile with measured hosts."""
    profiles = [load_profile(name) for name in shipped_profiles()]
    return tuple((p.meta.get("card"), p.meta.get("model"), p.hosts) for p in profiles
                 if p.meta.get("kind") == "measured" and p.hosts is not None)


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped in ``calibration/profiles``."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def resolve(name_or_path: str | Path) -> Path:
    """A file path as given, else the shipped profile for a name: ``<name>.json`` exactly, else the measured
    ``<name>*.json`` before analytic ones (then alphabetical)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = str(name_or_path)
    exact = PROFILES_DIR / f"{name}.json"
    if exact.is_file():
        return exact
    matches = sorted(PROFILES_DIR.glob(f"{name}*.json")) if "/" not in name else []
    if not matches:
        raise ValueError(f"unknown profile {name!r}: no such file and not a shipped profile; shipped: "
                         f"{', '.join(shipped_profiles()) or '(none)'}")
    return min(matches, key=lambda p: ("analytic" in p.stem, p.stem))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile from a path or a shipped name (see ``resolve``); ValueError on anything malformed."""
    path = resolve(name_or_path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    profile = Profile.from_dict(data, source=str(path))
    profile.source = str(path)
    return profile
