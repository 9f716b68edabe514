"""What serving adds to a profile's passes: the served engine's pass times, the serving loop's work between passes,
and the time a request and its tokens spend between the client and the engine.

A profile's pass (``calibration.sweep``) is an engine step from scheduling to the scheduler's update, timed alone.
Served, three things differ, each measured through the real server (``splitfuse validate`` traces every pass and
request; the fit uses its warm-up and overload runs, never the cells it is then judged on):
- the step itself, on a GPU that runs passes back to back with an API process beside it: ``path_scale``, per
  execution path (prompts alone apart: on the eager path from profile version 10, on the mixed graph from version
  12, ``scale_path``), the median of served step time / the profile's prediction;
- the engine loop's own work before the next step (building each sampled request's output, sending them to the
  API process, taking in commands): ``per_pass_s`` + ``per_sample_s`` x sampled entries, and from ``loop_knee``
  entries on a further ``per_sample_above_knee_s`` each (from profile version 9): a convex broken line through the
  traced passes whose next step followed at once. Served, the loop's work per entry grows with the batch, steeply
  past about 128 entries, which only overload runs reach; one line through their thousands of full-batch passes
  over-priced every pass of the cells below;
- admission, from the client's send until the engine process has the request (HTTP, JSON, tokenizing, the pipe):
  ``admission_per_token_s`` x prompt tokens plus a draw from ``admission_q``, its measured distribution, as
  quantiles. The distribution comes from requests sent to a lightly loaded server (the warm-up's closed-loop
  clients, ``light``): under a flood of three times the saturation rate the API process's backlog doubles the mean,
  a state no load below saturation reaches, where a few milliseconds matter to TTFT;
- decodes over contexts of very different lengths: ``decode_spread_s`` x ``decode_spread_tokens``, the tokens by
  which the longest context exceeds twice the mean, in decode steps, and ``mixed_spread_s`` x the same in passes
  that also hold prompt tokens (from profile version 14; older sections charge those nothing). The decodes'
  attention runs a program per sequence and KV head without splitting long contexts, so it waits on its longest
  one; the sweep's decode batches all share one context and cannot show it. Beside a chunk's attention launch the
  wait is partly hidden, and the price per token is its own. Each is fitted on the passes of its kind that have such
  a spread (heavy-tailed length mixes), by least squares on what the path's scale leaves; 0 where the runs have
  none;
- delivery, from the end of the pass that made a token until the client has it (the pipe, detokenizing, the
  stream): ``delivery_q`` (its median alone: a fresh draw per pass would add gaps between one stream's tokens that
  they do not have) plus ``delivery_per_sample_s`` x the pass's sampled entries, since the API process detokenizes
  and streams a pass's outputs one after another (from profile version 5; older sections have no such term);
- the card's clock under a stream of prompt work (from profile version 8): the path's scale is
  ``path_scale + heat_scale x heat``, where ``heat`` (``PrefillHeat``, 0 to 1) is the share of the last
  ``heat_tau_s`` or so the engine spent in passes with prompt tokens. Such passes draw the card to its power limit,
  where it lowers its clock, and every pass then runs slower; the sweep times each pass alone, at the clock its own
  repeats leave. Served passes replayed alone on the same card (``benchmarks/served_replay_gpu.py``) run 9% faster
  where they had followed prompt chunks, and as fast where they had not;
- prompt tokens' attention over their prefixes (from profile version 13): ``attention_scale``, per path, the share
  by which served passes exceed the sweep's price of that attention (``PassModel.attention_seconds``). A path's
  served step is ``scale x (swept step + attention_scale x swept attention)``. Served, a chunk on a deep prefix runs
  further over its swept price than a prompt alone: on every llama-2-7b H200 host, served / swept grew by 0.18-0.39
  with attention's share of the step (``calibration/VALIDATION.md``, twenty-fourth round). Older sections have none;
- the served step's work per sampled entry beyond the sweep's price (from profile version 16):
  ``step_per_sample_s`` x sampled entries on the graph paths, fitted with their levels (``fit_step_per_sample``,
  ``--level-per-sample``). Served, the host prepares each sequence's inputs before the graph runs, and that grows
  with the batch faster than in the sweep, by a card's host: on the cells of four mistral-7b H200 cards the served
  decode step ran 0.98 of its price at up to 8 sequences and 1.04-1.09 at 96-128 (``calibration/VALIDATION.md``,
  thirty-eighth round), so one level per path read a long mix's small batches too dear and a short mix's large
  ones too cheap. On the engine whose sampler no longer sorts (from 0570fa2) two llama-3-8b cards wanted none of
  it (``calibration/VALIDATION.md``, forty-fifth round): much of it was the old sampler's. Older sections have none;
- the spread of served passes around their price (from profile version 15): ``noise_q``, quantiles of each served
  pass's time (step and loop) over the section's price, each run's over its median, each host's distribution
  weighing as one (``served_noise``). The simulator draws each pass's factor from it instead of the sweep's repeats
  (``Profile.noise_factors``): served passes spread about five times as widely as a pass repeated alone, with a
  longer upper tail, so their mean lies above the median the section's numbers price (``calibration/VALIDATION.md``,
  thirty-third round). Older sections have none: the sweep's spread;
- greedy passes (from profile version 18; version 17's form is refused): ``greedy``. A graph pass whose requests
  all take their argmax takes it inside the graph and skips the sampling kernels: ``step_saved_s`` +
  ``step_saved_per_sample_s`` x sampled entries less than its price. After a decode step the engine then enqueues
  the next step before this one's tokens are back (``engine.policy.DecodeAhead``), so that step's host work
  (preparing its inputs, the loop's work on the step before) runs behind the GPU's too: ``ahead_saved_s`` +
  ``ahead_saved_per_sample_s`` x entries less. A step enqueued ahead and discarded (a prompt arrived) adds
  ``discarded`` of its price to the pass after it (``fit_greedy``). Older sections have none: greedy passes are
  priced as sampled ones.
- the graph bucket a mixed pass pads to (from profile version 19): ``bucket_scale``, per mixed-graph path, a factor
  per bucket of tokens on the path's scale. The sweep times every bucket, but the cost model is one line in the
  padded tokens and the served scale one number, fitted where served passes mostly are (the budget's bucket).
  Served, the buckets' pattern around that line repeats from card to card (a pass of a small bucket runs 5-7% over
  a full chunk's level, one of 240 tokens 13%; ``calibration/VALIDATION.md``, forty-third round), which a factor per
  bucket carries: each host's median per bucket split into the host's offset and one shape for every host (hosts
  that served other budgets included), scaled so that a host's typical pass keeps its price (``fit_bucket_scales``,
  ``--fit-buckets``). A bucket no served pass showed (above the calibration runs' budget; every bucket of a
  section fitted without them) takes the sweep's shape about its line from the budget's bucket, where the level is
  fitted (``calibration.sweep_buckets``): served, a budget of 1,024 runs its full chunks 3-4% over the 768-token
  bucket's level, as the sweep does. Older sections have none: every bucket at the path's scale.
- what a sampled pass saves since the sweep (from profile version 20): ``sampler_saved``, a table of seconds by
  sampled entries for decode-only passes and, where measured, one for passes with prompt tokens. The profiles were
  swept with a sampler that sorted every sampled row over the vocabulary; the engine since commit 0570fa2 draws
  rows without top-k or top-p in vocabulary order. Measured as the engine's own steps on one card with each engine
  (``calibration.sampler_saved``) and taken off the price of every pass that runs the sampler (greedy passes never
  did). Older sections have none: the sweep's sampler.
- what a graph step of many sampled entries saves (from profile version 21): past ``step_knee`` entries a served
  step on a graph path runs under its price by ``saved_s`` + ``per_sample_s`` x the entries past the knee, per path
  (``step_saved_past_knee``, ``fit_step_knee``, ``--fit-step-knee``). Served, llama-3-8b's decode steps of 129-160
  sampled entries ran 7-10% under their price on three cards where those of 97-128 ran 2-5% under, and its mixed
  passes further under the more entries they sample, 3% at 129-160 and 8-10% at 225-256 (``calibration/VALIDATION.md``,
  fiftieth round). Only overload runs reach such batches, and one line per path through all batches priced them
  where the cells' smaller ones are. Older sections have none.

A path's level alone can be refitted on later hosts (``fit_path_levels``, ``splitfuse validate --fit-levels``), its
heat growth and the rest of the section kept: where the hosts a path was first fitted on ran an older engine, or
were one host; and with its heat growth and attention scale (``fit_path_growth``, ``--level-growth``) where those
hosts could not show them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

PATHS = ("decode-graph", "mixed-graph", "eager", "eager-prefill", "mixed-prefill")
# A path priced apart from a later profile version, and the path whose scale (and heat) priced it before.
PREFILL_PATHS = {"eager-prefill": "eager", "mixed-prefill": "mixed-graph"}
GRAPH_PATHS = ("decode-graph", "mixed-graph")  # the paths whose passes sample: decodes, and prompts beside them
BUCKET_PATHS = ("mixed-graph", "mixed-prefill")  # the paths whose passes replay a graph of a token bucket
NUMBERS = ("per_pass_s", "per_sample_s", "admission_per_token_s", "delivery_per_sample_s", "decode_spread_s",
           "heat_tau_s", "loop_knee", "per_sample_above_knee_s", "mixed_spread_s", "step_per_sample_s", "step_knee")
# numbers a section without them omits, in the form of the versions before them
OPTIONAL_NUMBERS = ("step_per_sample_s", "step_knee")
KNEE_KEYS = ("saved_s", "per_sample_s")  # what a graph step saves past the knee, per path: at it, and per entry beyond
# a greedy graph pass as it runs: on its own, or a decode step enqueued ahead; and a discarded one, before the next
GREEDY_STEPS = ("step", "ahead", "discarded")
# the greedy section: a step on its own or ahead as its price less what it saves, a line in its sampled entries; what
# a discarded one adds to the next pass as a share of its price
SAVED_KINDS = ("decode", "mixed")  # the sampler's saving since the sweep: decode-only passes, passes with prompts
GREEDY_KEYS = ("step_saved_s", "step_saved_per_sample_s", "ahead_saved_s", "ahead_saved_per_sample_s", "discarded")
HEAT_TAU_S = 0.1  # the heat's time constant: the card's power control follows the last few passes
QUANTILES = 64  # points kept of each measured delay distribution
NOISE_QUANTILES = 1024  # points kept of the served passes' spread: its upper tail moves the mean and the p99s
# Below twice the mean, the longest decode context costs nothing the sum of contexts does not already price: on a
# heavy-tailed chat mix (calibration/VALIDATION.md, twelfth round) steps under 1.7 times the mean were on the model.
SPREAD_KNEE = 2.0


def scale_path(path: str, decode_tokens: int) -> str:
    """The serving section's name for the scale of a pass the engine runs on ``path`` (``engine.runner.ModelRunner.
    path``): "eager-prefill" or "mixed-prefill" for an eager or mixed-graph pass with no decodes (prompts alone),
    else ``path``. Served, prompts alone run closer to the sweep than passes with decodes, and more so as the card
    heats (llama-3-8b, ``calibration/VALIDATION.md``, eighteenth and twenty-third rounds)."""
    if decode_tokens:
        return path
    return {base: alone for alone, base in PREFILL_PATHS.items()}.get(path, path)


def decode_spread_tokens(decode_tokens: int, decode_context: int, decode_max_context: int) -> float:
    """Tokens by which a pass's longest decode context exceeds ``SPREAD_KNEE`` times the mean; 0 for a pass without
    decodes, and for one whose longest context is not known (``decode_max_context`` 0)."""
    if not decode_tokens:
        return 0.0
    return max(0.0, decode_max_context - SPREAD_KNEE * decode_context / decode_tokens)


class PrefillHeat:
    """The share of recent time the engine spent in passes with prompt tokens, weighted by exp(-age / ``tau_s``):
    0 on a card that only decoded (or idled), 1 on one that ran nothing but prompt chunks."""

    __slots__ = ("tau_s", "value", "since")

    def __init__(self, tau_s: float = HEAT_TAU_S) -> None:
        self.tau_s, self.value, self.since = float(tau_s), 0.0, 0.0

    def at(self, now: float) -> float:
        """The heat at ``now`` (not before the end of the last pass added)."""
        return self.value * math.exp(-max(0.0, now - self.since) / self.tau_s)

    def add(self, start: float, end: float, prefill_tokens: int) -> None:
        """A pass ran from ``start`` to ``end`` with ``prefill_tokens`` prompt tokens."""
        kept = math.exp(-max(0.0, end - start) / self.tau_s)
        self.value = self.at(start) * kept + (1.0 - kept if prefill_tokens else 0.0)
        self.since = end


def prefill_heats(passes: Sequence[Mapping], tau_s: float = HEAT_TAU_S) -> list[float]:
    """The heat at the start of each traced pass of one engine, in order (rows with ``start``, ``updated`` and
    ``prefill_tokens``)."""
    heat, heats = PrefillHeat(tau_s), []
    for p in passes:
        heats.append(heat.at(p["start"]))
        heat.add(p["start"], p["updated"], p["prefill_tokens"])
    return heats


def _bucket_scales(scales: Mapping) -> dict[str, dict[int, float]]:
    """{path: {bucket: factor}} of a section's ``bucket_scale`` (buckets as JSON keys too), each checked."""
    if not isinstance(scales, Mapping):
        raise ValueError(f"serving bucket_scale must be an object of paths, got {scales!r}")
    out = {}
    for path, factors in scales.items():
        if path not in BUCKET_PATHS:
            raise ValueError(f"serving bucket_scale: path {path!r} replays no bucketed graph; paths are "
                             f"{', '.join(BUCKET_PATHS)}")
        if not isinstance(factors, Mapping):
            raise ValueError(f"serving bucket_scale[{path}] must be an object of buckets, got {factors!r}")
        out[path] = {}
        for bucket, factor in factors.items():
            try:
                tokens = int(bucket)
            except (TypeError, ValueError):
                tokens = 0
            if tokens <= 0 or str(tokens) != str(bucket):
                raise ValueError(f"serving bucket_scale[{path}]: bucket {bucket!r} must be a positive token count")
            out[path][tokens] = _check(f"bucket_scale[{path}][{bucket}]", factor, 1e-3)
    return out


def _sampler_saved(saved: Mapping) -> dict[str, dict[str, list]]:
    """A section's ``sampler_saved``, checked: {} or {"decode": table[, "mixed": table]}, the saving of decode-only
    passes and of passes with prompt tokens (the decode one's where absent), a table {"batches": sampled entries,
    strictly increasing from 1, "seconds": the saving at each, >= 0}."""
    if not isinstance(saved, Mapping) or (saved and ("decode" not in saved or set(saved) - set(SAVED_KINDS))):
        raise ValueError(f"serving sampler_saved must be an object of a decode and maybe a mixed table, got {saved!r}")
    out = {}
    for kind, table in saved.items():
        where = f"serving sampler_saved[{kind}]"
        if not isinstance(table, Mapping) or sorted(table) != ["batches", "seconds"]:
            raise ValueError(f"{where} must be an object of batches and seconds, got {table!r}")
        batches, seconds = table["batches"], table["seconds"]
        if not isinstance(batches, Sequence) or not isinstance(seconds, Sequence) or not batches \
                or len(batches) != len(seconds):
            raise ValueError(f"{where} needs as many seconds as batches, at least one")
        if any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches) \
                or any(b <= a for a, b in zip(batches, batches[1:])):
            raise ValueError(f"{where} batches must be sampled entries >= 1, increasing, got {batches!r}")
        out[kind] = {"batches": list(batches),
                     "seconds": [_check(f"sampler_saved[{kind}].seconds[{i}]", x) for i, x in enumerate(seconds)]}
    return out


def _saved_table(table: Mapping | None) -> list[float]:
    """The saving at 0 .. the last measured batch of sampled entries (``np.interp``: the first batch's below it),
    one lookup per simulated pass."""
    if not table:
        return [0.0]
    return np.interp(np.arange(table["batches"][-1] + 1), table["batches"], table["seconds"]).tolist()


def _past_knee(saved: Mapping) -> dict[str, dict[str, float]]:
    """A section's ``step_saved_past_knee``, checked: {graph path: {"saved_s": s, "per_sample_s": s}}."""
    if not isinstance(saved, Mapping):
        raise ValueError(f"serving step_saved_past_knee must be an object of graph paths, got {saved!r}")
    checked = {}
    for path, numbers in saved.items():
        where = f"serving step_saved_past_knee[{path}]"
        if path not in GRAPH_PATHS:
            raise ValueError(f"{where}: not a graph path; those are {', '.join(GRAPH_PATHS)}")
        if not isinstance(numbers, Mapping) or sorted(numbers) != sorted(KNEE_KEYS):
            raise ValueError(f"{where} needs exactly the keys {', '.join(KNEE_KEYS)}, got {numbers!r}")
        checked[path] = {key: _check(f"step_saved_past_knee[{path}].{key}", numbers[key]) for key in KNEE_KEYS}
    return checked


def _check(name: str, value, low: float = 0.0) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= low):
        raise ValueError(f"serving {name} must be a finite number >= {low}, got {value!r}")
    return float(value)


def _quantiles(name: str, values: Sequence[float]) -> np.ndarray:
    values = [_check(f"{name}[{i}]", v) for i, v in enumerate(values or [0.0])]
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"serving {name} must be sorted (quantiles of a distribution)")
    return np.asarray(values)


class ServingModel:
    """The served engine's costs beyond a profile's passes (see the module docstring); every number in seconds."""

    __slots__ = (*NUMBERS, "admission_q", "delivery_q", "path_scale", "heat_scale", "attention_scale", "fit",
                 "noise_q", "greedy", "bucket_scale", "sampler_saved", "step_saved_past_knee", "_delivery_base",
                 "_saved_by_samples")

    def __init__(self, per_pass_s: float = 0.0, per_sample_s: float = 0.0, admission_per_token_s: float = 0.0,
                 admission_q: Sequence[float] = (), delivery_q: Sequence[float] = (),
                 path_scale: Mapping[str, float] | None = None, fit: Mapping | None = None,
                 delivery_per_sample_s: float = 0.0, decode_spread_s: float = 0.0,
                 heat_scale: Mapping[str, float] | None = None, heat_tau_s: float = HEAT_TAU_S,
                 loop_knee: float = 0.0, per_sample_above_knee_s: float = 0.0,
                 attention_scale: Mapping[str, float] | None = None, mixed_spread_s: float = 0.0,
                 noise_q: Sequence[float] = (), step_per_sample_s: float = 0.0,
                 greedy: Mapping[str, float] | None = None,
                 bucket_scale: Mapping[str, Mapping] | None = None,
                 sampler_saved: Mapping[str, Sequence] | None = None, step_knee: float = 0.0,
                 step_saved_past_knee: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.per_pass_s, self.per_sample_s = _check("per_pass_s", per_pass_s), _check("per_sample_s", per_sample_s)
        self.loop_knee = _check("loop_knee", loop_knee)
        self.per_sample_above_knee_s = _check("per_sample_above_knee_s", per_sample_above_knee_s)
        self.heat_tau_s = _check("heat_tau_s", heat_tau_s, 1e-3)
        self.admission_per_token_s = _check("admission_per_token_s", admission_per_token_s)
        self.delivery_per_sample_s = _check("delivery_per_sample_s", delivery_per_sample_s)
        self.decode_spread_s = _check("decode_spread_s", decode_spread_s)
        self.mixed_spread_s = _check("mixed_spread_s", mixed_spread_s)
        self.step_per_sample_s = _check("step_per_sample_s", step_per_sample_s)
        self.step_knee = _check("step_knee", step_knee)
        self.step_saved_past_knee = _past_knee(step_saved_past_knee or {})
        if self.step_saved_past_knee and not self.step_knee:
            raise ValueError("serving step_saved_past_knee needs a step_knee > 0 (the sampled entries it starts past)")
        self.sampler_saved = _sampler_saved(sampler_saved or {})
        self._saved_by_samples = {kind: _saved_table(self.sampler_saved.get(kind, self.sampler_saved.get("decode")))
                                  for kind in SAVED_KINDS}
        self.admission_q, self.delivery_q = _quantiles("admission_q", admission_q), _quantiles("delivery_q",
                                                                                                delivery_q)
        self._delivery_base = float(np.median(self.delivery_q))  # once: the simulator asks after every pass
        self.noise_q = _quantiles("noise_q", noise_q) if len(noise_q) else np.empty(0)
        if len(self.noise_q) and self.noise_q[0] <= 0:
            raise ValueError(f"serving noise_q must be positive factors, got {self.noise_q[0]!r}")
        scale = dict(path_scale or {})
        unknown = [p for p in scale if p not in PATHS]
        if unknown:
            raise ValueError(f"serving path_scale: unknown path {unknown[0]!r}; paths are {', '.join(PATHS)}")
        for alone, base in PREFILL_PATHS.items():  # before versions 10 and 12 the base path priced both
            if alone not in scale and base in scale:
                scale[alone] = scale[base]
        self.path_scale = {p: _check(f"path_scale[{p}]", scale.get(p, 1.0), 1e-3) for p in PATHS}
        heat = dict(heat_scale or {})
        unknown = [p for p in heat if p not in PATHS]
        if unknown:
            raise ValueError(f"serving heat_scale: unknown path {unknown[0]!r}; paths are {', '.join(PATHS)}")
        for alone, base in PREFILL_PATHS.items():
            if alone not in heat and base in heat:
                heat[alone] = heat[base]
        self.heat_scale = {p: _check(f"heat_scale[{p}]", heat.get(p, 0.0)) for p in PATHS}
        attention = dict(attention_scale or {})
        unknown = [p for p in attention if p not in PATHS]
        if unknown:
            raise ValueError(f"serving attention_scale: unknown path {unknown[0]!r}; paths are {', '.join(PATHS)}")
        self.attention_scale = {p: _check(f"attention_scale[{p}]", attention.get(p, 0.0)) for p in PATHS}
        greedy = dict(greedy or {})
        if greedy and sorted(greedy) != sorted(GREEDY_KEYS):
            raise ValueError(f"serving greedy needs exactly the keys {', '.join(GREEDY_KEYS)}, got "
                             f"{', '.join(sorted(greedy))}")
        self.greedy = {k: _check(f"greedy[{k}]", v) for k, v in greedy.items()} or None
        self.bucket_scale = _bucket_scales(bucket_scale or {})
        self.fit = dict(fit or {})

    @property
    def heats(self) -> bool:
        """Whether a pass's time depends on the card's heat (some path has a heat scale)."""
        return any(self.heat_scale.values())

    def scale(self, path: str, heat: float = 0.0) -> float:
        """Served step / swept step on ``path`` (``scale_path``) at ``heat`` (``PrefillHeat``)."""
        return self.path_scale[path] + self.heat_scale[path] * heat

    def step_seconds(self, path: str, step: float, num_samples: int, heat: float = 0.0, bucket: int = 0) -> float:
        """The served step on ``path`` of a pass the sweep priced at ``step`` seconds that sampled ``num_samples``
        entries, on a card of that ``heat``, padded to a graph of ``bucket`` tokens (0: none). The work per sampled
        entry is the graph paths' (``GRAPH_PATHS``), where it is fitted; the eager paths' levels carry theirs. Past
        ``step_knee`` entries a graph path's step saves ``step_saved_past_knee`` (never below 0)."""
        per_sample = self.step_per_sample_s * num_samples if path in GRAPH_PATHS else 0.0
        buckets = self.bucket_scale.get(path)
        scale = self.scale(path, heat) * (buckets.get(bucket, 1.0) if buckets else 1.0)
        return max(0.0, scale * step + per_sample - self.knee_saved_seconds(path, num_samples))

    def knee_saved_seconds(self, path: str, num_samples: int) -> float:
        """What a served step on ``path`` of ``num_samples`` sampled entries saves past the section's knee (0 at or
        below it, on the eager paths and in a section without one)."""
        saved = self.step_saved_past_knee.get(path)
        if saved is None or num_samples <= self.step_knee:
            return 0.0
        return saved["saved_s"] + saved["per_sample_s"] * (num_samples - self.step_knee)

    def greedy_seconds(self, kind: str, price: float, num_samples: int) -> float | None:
        """A served graph pass whose ``num_samples`` entries all take their argmax, priced ``price`` seconds as a
        sampled one, as it runs (``kind``, one of ``GREEDY_STEPS``): on its own ("step": the price less the sampling
        it skips), a decode step enqueued ahead of the one before ("ahead": less that and the host work it hid behind
        that one's GPU work; both grow with its entries), or enqueued ahead and discarded ("discarded": what it adds
        to the pass after it, a share of its price). None where the section measured no greedy serving."""
        g = self.greedy
        if g is None:
            return None
        if kind == "discarded":
            return g["discarded"] * price
        return max(0.0, price - g[f"{kind}_saved_s"] - g[f"{kind}_saved_per_sample_s"] * num_samples)

    def sampler_saved_seconds(self, num_samples: int, prefill_tokens: int = 0) -> float:
        """What a pass that ran the sampler on ``num_samples`` entries saves against its swept price, where the
        engine's sampler changed since the sweep (``calibration.sampler_saved``): the saving measured at that many
        entries in passes of its kind (with ``prefill_tokens`` or without), linear between the measured batches, the
        nearest one's outside them; 0 for a pass that sampled none or a section without it."""
        table = self._saved_by_samples["mixed" if prefill_tokens else "decode"]
        return table[min(num_samples, len(table) - 1)] if num_samples else 0.0

    def loop_seconds(self, num_samples: int) -> float:
        """The engine loop's work after a pass that sampled ``num_samples`` entries."""
        return (self.per_pass_s + self.per_sample_s * num_samples
                + self.per_sample_above_knee_s * max(0.0, num_samples - self.loop_knee))

    def spread_seconds(self, f) -> float:
        """What a pass with features ``f`` takes beyond the path's scaled prediction, for the spread of its decodes'
        contexts."""
        per_token = self.mixed_spread_s if f.prefill_tokens else self.decode_spread_s
        if not per_token:
            return 0.0
        return per_token * decode_spread_tokens(f.decode_tokens, f.decode_context, f.decode_max_context)

    def admission_seconds(self, prompt_tokens: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        """From the client's send until the engine process has the request, for each prompt length and uniform
        draw in [0, 1)."""
        q = self.admission_q
        return self.admission_per_token_s * prompt_tokens + q[(uniforms * len(q)).astype(np.int64)]

    def delivery_seconds(self, num_samples: int) -> float:
        """From the end of a pass that sampled ``num_samples`` entries until the client has its tokens."""
        return self._delivery_base + self.delivery_per_sample_s * num_samples

    def to_dict(self) -> dict:
        # a section without work per sampled entry in its step, or without a knee in it, keeps the form of the
        # versions before them
        numbers = [name for name in NUMBERS if name not in OPTIONAL_NUMBERS or getattr(self, name)]
        return {**{name: getattr(self, name) for name in numbers}, "admission_q": self.admission_q.tolist(),
                "delivery_q": self.delivery_q.tolist(), "path_scale": self.path_scale,
                "heat_scale": self.heat_scale, "attention_scale": self.attention_scale, "fit": self.fit,
                **({"noise_q": self.noise_q.tolist()} if len(self.noise_q) else {}),
                **({"greedy": self.greedy} if self.greedy else {}),
                **({"bucket_scale": {path: {str(b): f for b, f in factors.items()}
                                     for path, factors in self.bucket_scale.items()}} if self.bucket_scale else {}),
                **({"sampler_saved": self.sampler_saved} if self.sampler_saved else {}),
                **({"step_saved_past_knee": self.step_saved_past_knee} if self.step_saved_past_knee else {})}

    def with_noise(self, noise_q: Sequence[float], fit: Mapping | None = None) -> ServingModel:
        """This section with ``noise_q`` as its served passes' spread (``served_noise``) and ``fit`` (how it was
        measured) under the fit's "noise"."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "noise_q": list(noise_q), "fit": {**d["fit"], "noise": dict(fit or {})}})

    def with_path_levels(self, levels: Mapping[str, float], fit: Mapping | None = None) -> ServingModel:
        """This section with ``levels`` as those paths' scales at heat 0 (``fit_path_levels``), their heat growth
        kept, and ``fit`` (how they were measured) under the fit's "levels"."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "path_scale": {**d["path_scale"], **levels},
                                       "fit": {**d["fit"], "levels": dict(fit or {})}})

    def with_loop(self, per_pass_s: float, per_sample_s: float, knee: float, above_knee_s: float,
                  fit: Mapping | None = None) -> ServingModel:
        """This section with the serving loop's line (``fit_loop``: per pass, per sampled entry, the knee and the
        further work per entry past it) and ``fit`` under the fit's "loop", the previous line kept there as
        "before"; the rest of the section kept."""
        d = self.to_dict()
        before = {"per_pass_s": self.per_pass_s, "per_sample_s": self.per_sample_s, "loop_knee": self.loop_knee,
                  "per_sample_above_knee_s": self.per_sample_above_knee_s}
        return ServingModel.from_dict({**d, "per_pass_s": per_pass_s, "per_sample_s": per_sample_s,
                                       "loop_knee": knee, "per_sample_above_knee_s": above_knee_s,
                                       "fit": {**d["fit"], "loop": {**dict(fit or {}), "before": before}}})

    def with_sampler_saved(self, saved: Mapping[str, Mapping], fit: Mapping | None = None) -> ServingModel:
        """This section with ``saved``, what a sampled pass saves since the sweep ({"decode": {"batches": [...],
        "seconds": [...]}[, "mixed": ...]}, ``calibration.sampler_saved``), and ``fit`` (how it was measured) under
        the fit's "sampler_saved"."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "sampler_saved": dict(saved),
                                       "fit": {**d["fit"], "sampler_saved": dict(fit or {})}})

    def with_step_per_sample(self, seconds: float, fit: Mapping | None = None) -> ServingModel:
        """This section with ``seconds`` as its served step's work per sampled entry (``fit_step_per_sample``) and
        ``fit`` under the fit's "step_per_sample"; its levels are still to be fitted at it."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "step_per_sample_s": seconds,
                                       "fit": {**d["fit"], "step_per_sample": dict(fit or {})}})

    def with_step_knee(self, knee: float, saved: Mapping[str, Mapping[str, float]],
                       fit: Mapping | None = None) -> ServingModel:
        """This section with what its graph steps save past ``knee`` sampled entries (``saved``, per path:
        ``fit_step_knee``; {} for none) and ``fit`` under the fit's "step_knee", the rest of the section kept."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "step_knee": knee, "step_saved_past_knee": dict(saved),
                                       "fit": {**d["fit"], "step_knee": dict(fit or {})}})

    def with_path_growth(self, attention: Mapping[str, float], heat: Mapping[str, float],
                         fit: Mapping | None = None) -> ServingModel:
        """This section with ``attention`` and ``heat`` as those paths' attention scales and heat growth
        (``fit_path_growth``), and ``fit`` under the fit's "growth"; their levels are still to be fitted at it."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "attention_scale": {**d["attention_scale"], **attention},
                                       "heat_scale": {**d["heat_scale"], **heat},
                                       "fit": {**d["fit"], "growth": dict(fit or {})}})

    def with_greedy(self, greedy: Mapping[str, float], fit: Mapping | None = None) -> ServingModel:
        """This section with ``greedy`` as its greedy passes' prices (``fit_greedy``) and ``fit`` under the fit's
        "greedy"."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "greedy": dict(greedy),
                                       "fit": {**d["fit"], "greedy": dict(fit or {})}})

    def with_bucket_scale(self, scales: Mapping[str, Mapping[int, float]], fit: Mapping | None = None,
                          key: str = "buckets") -> ServingModel:
        """This section with ``scales`` as its mixed paths' factors per graph bucket (``fit_bucket_scales``; a path
        not in ``scales`` keeps its own) and ``fit`` under the fit's ``key``."""
        d = self.to_dict()
        return ServingModel.from_dict({**d, "bucket_scale": {**d.get("bucket_scale", {}), **scales},
                                       "fit": {**d["fit"], key: dict(fit or {})}})

    @classmethod
    def from_dict(cls, d: Mapping) -> ServingModel:
        """Also reads sections of older profile versions: before 8 no heat scale (every pass at the path's scale),
        before 9 no knee in the loop (one line), before 13 no attention scale, before 14 no spread in passes with
        prompt tokens, before 15 no served spread (the sweep's), before 16 no served step's work per sampled entry,
        before 17 no greedy decode steps (priced as sampled ones), before 19 no factor per graph bucket, before 20 no
        sampler saving since the sweep, before 21 no saving past a knee in a graph step's sampled entries. Version
        17's ``greedy_scale`` priced a step ahead as a share of its price, which the host work it hides is not: such
        a section is refused, named."""
        if not isinstance(d, Mapping):
            raise ValueError("'serving' must be an object")
        if "greedy_scale" in d:
            raise ValueError("'serving' has a greedy_scale (profile version 17), which priced a decode step enqueued "
                             "ahead as a share of its price; from version 18 a greedy pass costs its price less what "
                             "it saves (greedy): refit it on the greedy runs with `splitfuse validate --fit-greedy`, "
                             "or drop it to price greedy passes as sampled ones")
        unknown = [k for k in d if k not in (*NUMBERS, "admission_q", "delivery_q", "path_scale", "heat_scale",
                                             "attention_scale", "fit", "noise_q", "greedy", "bucket_scale",
                                             "sampler_saved", "step_saved_past_knee")]
        if unknown:
            raise ValueError(f"'serving' has an unknown key {unknown[0]!r}")
        return cls(**d)


def fit_greedy(rows, min_count: int = 10) -> tuple[dict[str, float], dict]:
    """``greedy`` (``ServingModel``) from served greedy decode-graph steps: rows with ``host``, ``kind`` (one of
    ``GREEDY_STEPS``), for "step" and "ahead" ``num_samples`` and ``saved_s`` (the step's price less its served
    time, loop included), and for "discarded" ``ratio`` (what the pass after a discarded step took beyond its price,
    over the price of that step). What a step saves is a line in its sampled entries (both terms at least 0) through
    bins of ``LOOP_BIN`` entries, each bin's point the median of its hosts' medians (``_host_medians``), as the
    loop's: as a share of the price it read too little on long contexts and too much on short ones, and on models
    of a large vocabulary the sampling a greedy step skips grows with the batch (``calibration/VALIDATION.md``,
    fortieth round). The discarded share is each host's median, then the median over hosts. Only hosts with
    ``min_count`` rows of a kind count for it. Returns (the section's numbers, how they were measured); ValueError
    naming the kind no host served that often."""
    import pandas as pd

    rows = pd.DataFrame(rows, columns=["host", "kind", "ratio", "num_samples", "saved_s"])
    greedy, fit = {}, {"min_count": min_count}

    def served(kind, *columns):
        part = _finite_rows(rows[rows["kind"] == kind], *columns)
        part = part[part.groupby("host")[columns[0]].transform("size") >= min_count]
        if part.empty:
            raise ValueError(f"no host served {min_count} greedy decode-graph steps of the kind {kind!r} (send "
                             f"requests at temperature 0: --temperature 0)")
        return part

    for kind in ("step", "ahead"):
        part = served(kind, "saved_s", "num_samples")
        medians, _ = _host_medians(part, lambda host_rows: _loop_bins(host_rows, "saved_s"))
        if medians.empty:  # no bin with passes enough: one line through every host's steps
            medians = pd.DataFrame({"x": part["num_samples"], "y": part["saved_s"]})
        saved, per_sample, _ = _line(medians["x"], medians["y"], kind)
        greedy[f"{kind}_saved_s"], greedy[f"{kind}_saved_per_sample_s"] = saved, per_sample
        samples, y = part["num_samples"].to_numpy(dtype=float), part["saved_s"].to_numpy(dtype=float)
        residual = np.abs(y - saved - per_sample * samples)
        fit[kind] = {"hosts": sorted(map(str, part["host"].unique())), "steps": int(len(part)),
                     "bins": int(len(medians)), "x_range": [float(samples.min()), float(samples.max())],
                     "median_abs_residual_s": float(np.median(residual)),
                     "p95_abs_residual_s": float(np.percentile(residual, 95))}
    part = served("discarded", "ratio")
    medians = part.groupby("host")["ratio"].median()
    greedy["discarded"] = max(float(np.median(medians)), 0.0)
    fit["discarded"] = {"hosts": {h: round(float(m), 5) for h, m in medians.items()}, "steps": int(len(part))}
    return {k: greedy[k] for k in GREEDY_KEYS}, fit


def served_noise(ratios: Mapping[str, Sequence[np.ndarray]]) -> tuple[list[float], dict]:
    """The spread of served passes around their price, as ``NOISE_QUANTILES`` mid-quantiles, and how it was
    measured. ``ratios``: per host, one array per run of each traced pass's served time (step and loop) over the
    section's price of it. Each run's ratios are taken over their median, so a host's or run's level (the hosts
    section's business) leaves only the spread; each host's quantiles then weigh as one in their mean."""
    probs = (np.arange(NOISE_QUANTILES) + 0.5) / NOISE_QUANTILES
    per_host = {}
    for host, runs in ratios.items():
        runs = [r[np.isfinite(r) & (r > 0)] for r in map(np.asarray, runs)]
        runs = [r / np.median(r) for r in runs if len(r)]
        if runs:
            per_host[host] = np.quantile(np.concatenate(runs), probs)
    if not per_host:
        raise ValueError("no traced pass with a served time and a price to measure the spread on")
    q = np.mean(list(per_host.values()), axis=0)
    means = {host: round(float(v.mean()), 5) for host, v in per_host.items()}
    return [round(float(x), 5) for x in q], {
        "hosts": len(per_host), "passes": int(sum(len(r) for runs in ratios.values() for r in runs)),
        "mean": round(float(q.mean()), 5), "p10": round(float(np.quantile(q, 0.1)), 5),
        "p90": round(float(np.quantile(q, 0.9)), 5), "p99": round(float(np.quantile(q, 0.99)), 5),
        "host_means": means}


LEVEL_DECODE_MAX_SAMPLES = 128  # larger decode steps run hotter than any cell's below saturation


def _level_passes(passes, paths: Sequence[str] | None):
    """``passes`` (rows as ``fit_path_levels`` takes) as a frame of the ``paths`` (default every one) whose levels
    a cell below saturation runs at: no spread of decode contexts, no decode step of more than
    ``LEVEL_DECODE_MAX_SAMPLES`` sequences (an overload run's largest batches, hotter than any cell's), no pass that
    discarded a greedy decode step enqueued ahead (``discarded``: it carries that step's work, which the greedy
    section prices; such passes are mostly a fresh prompt's first chunk, in the buckets below the budget's)."""
    import pandas as pd

    passes = pd.DataFrame(passes, columns=["path", "pass_s", "model_s", "num_samples", "spread_tokens", "heat",
                                           "host", "attention_s", "prefill_tokens", "bucket", "discarded"])
    numbers = ["pass_s", "model_s", "num_samples", "spread_tokens", "heat", "attention_s", "prefill_tokens", "bucket"]
    passes[numbers] = passes[numbers].astype(float).fillna({"spread_tokens": 0.0, "heat": 0.0, "attention_s": 0.0,
                                                            "prefill_tokens": 0.0, "bucket": 0.0})
    passes["host"] = passes["host"].astype(object).fillna("")
    unknown = sorted(set(paths or ()) - set(PATHS))
    if unknown:
        raise ValueError(f"unknown serving path {unknown[0]!r}; paths are {', '.join(PATHS)}")
    kept = (passes["spread_tokens"] == 0) & ((passes["prefill_tokens"] > 0)
                                             | (passes["num_samples"] <= LEVEL_DECODE_MAX_SAMPLES))
    kept &= ~passes["discarded"].eq(True)  # (rows without the column: NaN)
    return passes[kept & passes["path"].isin(paths if paths else PATHS)]


def fit_path_levels(passes, serving: ServingModel, paths: Sequence[str] | None = None,
                    min_count: int = 10) -> tuple[dict[str, float], dict]:
    """({path: scale at heat 0}, fit summary) of ``paths`` (default: every path ``passes`` hold) at the median
    host: each host's median of served / priced step less ``serving``'s heat growth at the pass's heat, then the
    median over the hosts with ``min_count`` passes of the path, each host weighing as one. ``passes``: rows as
    ``fit_serving`` takes (``model_s`` the swept step; the section's attention scale is added, and its work per
    sampled entry taken off the served step). Only the level moves: the heat growth, loop, spreads and noise stay
    the section's. Passes as ``_level_passes`` keeps."""
    passes = _level_passes(passes, paths)
    if passes.empty:  # (an empty frame's columns lose their number types)
        raise ValueError(f"no path has {min_count} passes on a host to fit its level on")
    model_s = _swept_steps(passes, serving.attention_scale) * _bucket_factors(passes, serving)
    served = passes["pass_s"] - serving.step_per_sample_s * passes["num_samples"] + _knee_saved(passes, serving)
    rows = _finite_rows(passes.assign(ratio=served / model_s), "ratio", "heat")
    levels, fit = {}, {}
    for path, part in rows.groupby("path"):
        hosts = _host_levels({host: g for host, g in part.groupby("host") if len(g) >= min_count},
                             serving.heat_scale[path])
        if hosts:
            levels[path] = float(np.median(list(hosts.values())))
            fit[path] = {"n": int(len(part)), "hosts": len(hosts), "before": serving.path_scale[path],
                         "host_levels": hosts}
    if not levels:
        raise ValueError(f"no path has {min_count} passes on a host to fit its level on")
    return levels, fit


def fit_bucket_scales(passes, serving: ServingModel, min_count: int = 10) -> tuple[dict[str, dict[int, float]], dict]:
    """({path: {bucket: factor}}, fit summary) of the mixed-graph paths (``BUCKET_PATHS``) on ``serving``'s scale.
    Each host's median of served / priced step in each bucket with ``min_count`` passes is split into a host's
    offset times a bucket's shape (``bucket_shape``: hosts that served other budgets, whose typical pass sits in
    another bucket, share one shape). The shape is then scaled so that a host's median pass keeps its price under
    the section's own factors (the median over hosts, each weighing as one), so the path's level keeps its meaning
    and a refit moves the shape, not the level. The priced step is the section's (its level, heat growth and
    attention scale; its work per sampled entry taken off the served step), without factors per bucket. Rows as
    ``fit_path_levels`` takes, with ``bucket`` (``PassModel.bucket``; 0: a row of several passes, not counted).
    Passes as ``_level_passes`` keeps."""
    too_few = f"no mixed-graph path has {min_count} passes of a bucket on a host to fit its factor on"
    passes = _level_passes(passes, BUCKET_PATHS)
    passes = passes[passes["bucket"] > 0]
    if passes.empty:  # (an empty frame's columns lose their number types)
        raise ValueError(too_few)
    model_s = _swept_steps(passes, serving.attention_scale)
    priced = model_s * (passes["path"].map(serving.path_scale) + passes["path"].map(serving.heat_scale)
                        * passes["heat"])
    served = passes["pass_s"] - serving.step_per_sample_s * passes["num_samples"] + _knee_saved(passes, serving)
    rows = _finite_rows(passes.assign(ratio=served / priced, bucket=passes["bucket"].astype(int)), "ratio")
    scales, fit = {}, {}
    for path, part in rows.groupby("path"):
        counted = part.groupby(["host", "bucket"]).filter(lambda g: len(g) >= min_count)
        if counted.empty:
            continue
        medians = {(h, b): float(np.median(g["ratio"])) for (h, b), g in counted.groupby(["host", "bucket"])}
        shape = bucket_shape(medians)
        own = serving.bucket_scale.get(path, {})
        # each host's median pass, priced by the shape against the section's factors
        anchor = float(np.median([np.median([shape[b] / own.get(b, 1.0) for b in g["bucket"]])
                                  for _, g in counted.groupby("host")]))
        scales[path] = {b: shape[b] / anchor for b in sorted(shape)}
        fit[path] = {"n": int(len(part)), "hosts": int(counted["host"].nunique()),
                     "bucket_hosts": {str(b): int(g["host"].nunique()) for b, g in counted.groupby("bucket")}}
    if not scales:
        raise ValueError(too_few)
    return scales, fit


def bucket_shape(medians: Mapping[tuple[str, int], float], rounds: int = 100) -> dict[int, float]:
    """{bucket: shape} of ``medians`` {(host, bucket): served / priced}, split into host offset x bucket shape by
    Tukey's median polish on their logarithms (robust to one host's odd bucket), the shape's median over buckets 1.
    A bucket only hosts apart from the others served is on their scale only through those hosts' offsets."""
    hosts = sorted({h for h, _ in medians})
    buckets = sorted({b for _, b in medians})
    residual = np.full((len(hosts), len(buckets)), np.nan)
    for (h, b), m in medians.items():
        residual[hosts.index(h), buckets.index(b)] = math.log(m)
    effect = np.zeros(len(buckets))
    for _ in range(rounds):
        row = np.nanmedian(residual, axis=1, keepdims=True)
        column = np.nanmedian(residual - row, axis=0)
        residual -= row + column
        effect += column
        if max(np.abs(row).max(), np.abs(column).max()) < 1e-12:
            break
    return {b: float(math.exp(e)) for b, e in zip(buckets, effect - np.median(effect))}


def _knee_saved(passes, serving: ServingModel) -> np.ndarray:
    """What each row of ``passes`` saves past the section's knee (``ServingModel.knee_saved_seconds``): a fit of
    levels or buckets gives it back to the served step, as the section prices the step before taking it off."""
    return np.array([serving.knee_saved_seconds(path, n) for path, n in zip(passes["path"], passes["num_samples"])])


def _swept_steps(passes, attention_scale: Mapping[str, float]):
    """Each row's swept step (``model_s``) with its prompt attention grown by its path's ``attention_scale``."""
    return passes["model_s"] + passes["path"].map(attention_scale).fillna(0.0) * passes["attention_s"]


def _bucket_factors(passes, serving: ServingModel) -> np.ndarray:
    """The section's factor per graph bucket of each row of ``passes`` (a frame with ``path`` and ``bucket``)."""
    if not serving.bucket_scale:
        return np.ones(len(passes))
    return np.array([serving.bucket_scale.get(path, {}).get(int(b), 1.0)
                     for path, b in zip(passes["path"], passes["bucket"])])


def fit_step_per_sample(passes, serving: ServingModel, paths: Sequence[str] | None = None,
                        min_count: int = 10) -> tuple[float, dict]:
    """(the served step's work per sampled entry beyond the sweep's price, fit summary): each host with
    ``min_count`` passes that sample fits served step = level(path) x priced step + b x sampled entries over the
    graph ``paths`` (default both; ``GRAPH_PATHS``) at once, the level free per path, robust to the odd slow pass
    (each residual a share of the priced step), and b is the median over those hosts, at least 0. The priced step
    is the section's (``model_s`` the swept step, with its attention scale and heat growth). Passes as
    ``_level_passes`` keeps."""
    too_few = f"no host has {min_count} passes that sample on a graph path to fit the step's work per sampled entry on"
    paths = [p for p in (paths or GRAPH_PATHS) if p in GRAPH_PATHS]
    passes = _level_passes(passes, paths) if paths else []
    if len(passes) == 0:  # (an empty frame's columns lose their number types)
        raise ValueError(too_few)
    model_s = _swept_steps(passes, serving.attention_scale) * _bucket_factors(passes, serving)
    rows = _finite_rows(passes.assign(priced=model_s), "pass_s", "priced", "heat")
    rows = rows[rows["num_samples"] > 0]
    hosts = {}
    for host, part in rows.groupby("host"):
        shown = [p for p in paths if (part["path"] == p).sum() >= min_count]
        if not shown:
            continue
        part = part[part["path"].isin(shown)]
        priced = part["priced"].to_numpy()
        heat = (part["path"].map(serving.heat_scale) * part["heat"]).to_numpy()
        # the heat growth and the saving past the knee are the section's
        served = part["pass_s"].to_numpy() - heat * priced + _knee_saved(part, serving)
        X = np.column_stack([*(priced * (part["path"] == p).to_numpy() for p in shown),
                             part["num_samples"].to_numpy(dtype=float)])
        start = np.array([*(serving.path_scale[p] for p in shown), 0.0])
        coef = _robust_fit(X, served, start, priced)
        hosts[host] = {"per_sample_s": float(coef[-1]), "levels": dict(zip(shown, map(float, coef[:-1]))),
                       "n": int(len(part)), "samples_p90": float(np.percentile(X[:, -1], 90))}
    if not hosts:
        raise ValueError(too_few)
    per_sample = max(0.0, float(np.median([h["per_sample_s"] for h in hosts.values()])))
    return per_sample, {"hosts": hosts, "before": serving.step_per_sample_s}


STEP_KNEE = 128  # sampled entries past which a served graph step runs further under its price (fit_step_knee)


def fit_step_knee(passes, serving: ServingModel, knee: float = STEP_KNEE,
                  min_count: int = 10) -> tuple[dict[str, dict[str, float]], dict]:
    """({graph path: {"saved_s", "per_sample_s"}}, fit summary): what a served graph step of more than ``knee``
    sampled entries saves against the section's price without a knee (levels, heat, buckets, work per sampled
    entry). Each host with ``min_count`` such passes of a path fits price - served = saved_s + per_sample_s x
    (entries - knee), robust to the odd slow pass (each residual a share of the price); each number is the median
    over those hosts, at least 0. ``passes``: rows as ``fit_path_levels`` takes, with ``greedy`` (a pass of a run
    sent at temperature 0, which skips the sampling: left out); passes with a spread of decode contexts are left
    out too. ValueError where no host has ``min_count`` passes past the knee on a graph path."""
    import pandas as pd

    if not (isinstance(knee, (int, float)) and not isinstance(knee, bool) and knee >= 1):
        raise ValueError(f"the step's knee must be a number of sampled entries >= 1, got {knee!r}")
    passes = pd.DataFrame(passes, columns=["path", "pass_s", "model_s", "num_samples", "spread_tokens", "heat",
                                           "host", "attention_s", "bucket", "greedy"])
    numbers = ["pass_s", "model_s", "num_samples", "spread_tokens", "heat", "attention_s", "bucket"]
    passes[numbers] = passes[numbers].astype(float).fillna({"spread_tokens": 0.0, "heat": 0.0, "attention_s": 0.0,
                                                            "bucket": 0.0})
    kept = (passes["path"].isin(GRAPH_PATHS) & (passes["num_samples"] > knee) & (passes["spread_tokens"] == 0)
            & ~passes["greedy"].fillna(False).astype(bool))
    rows = _finite_rows(passes[kept], "pass_s", "model_s", "heat")
    too_few = (f"no host has {min_count} passes past {knee:g} sampled entries on a graph path (sampled warm-up and "
               "overload runs) to fit the step's knee on")
    if len(rows) == 0:  # (an empty frame's columns lose their number types)
        raise ValueError(too_few)
    plain = serving.with_step_knee(0.0, {})
    swept = _swept_steps(rows, serving.attention_scale).to_numpy()
    priced = np.array([plain.step_seconds(path, step, int(n), heat, int(bucket)) for path, step, n, heat, bucket
                       in zip(rows["path"], swept, rows["num_samples"], rows["heat"], rows["bucket"])])
    rows = rows.assign(priced=priced, past=rows["num_samples"] - knee)
    hosts: dict[str, dict] = {}
    for (path, host), part in rows.groupby(["path", "host"]):
        if len(part) < min_count:
            continue
        X = np.column_stack([np.ones(len(part)), part["past"].to_numpy()])
        saved = part["priced"].to_numpy() - part["pass_s"].to_numpy()
        coef = _robust_fit(X, saved, np.zeros(2), part["priced"].to_numpy())
        hosts.setdefault(path, {})[host] = {"saved_s": float(coef[0]), "per_sample_s": float(coef[1]),
                                            "n": int(len(part))}
    if not hosts:
        raise ValueError(too_few)
    saved = {path: {key: max(0.0, float(np.median([h[key] for h in fits.values()]))) for key in KNEE_KEYS}
             for path, fits in hosts.items()}
    before = {"step_knee": serving.step_knee, "step_saved_past_knee": serving.step_saved_past_knee}
    return saved, {"knee": float(knee), "hosts": hosts, "before": before}


def fit_path_growth(passes, serving: ServingModel, paths: Sequence[str] | None = None,
                    min_count: int = 10, attention: bool = True) -> tuple[dict[str, float], dict[str, float], dict]:
    """({path: attention scale}, {path: heat growth}, fit summary) of ``paths`` (default every one ``passes``
    hold), each the median over the hosts that show it, as ``fit_serving`` fits them (``_attention_scales``, then
    ``_heat_slope`` on the served / priced step with that attention): for a section whose paths were fitted on
    hosts that could not show them (too few, or an engine before version 8 or 13 of the profile). A path no host
    shows keeps the section's growth, except prompts alone: served mostly on an idle, cool engine, they span too
    little heat, and take the growth their base path's hosts show (``PREFILL_PATHS``, as sections before versions
    10 and 12 priced them), and its attention scale too: the same graph's kernels, in a few passes a run that
    cannot separate attention's share from noise. The levels are then ``fit_path_levels``'s, at the new growth.
    Without ``attention`` the section's attention scales are kept and only the heat growth is fitted, at them: for
    runs whose hosts disagree on attention, or whose prompts span few prefixes (whole prompts, as decode-first
    runs them). Passes as ``_level_passes`` keeps."""
    passes = _level_passes(passes, paths)
    if passes.empty:  # (an empty frame's columns lose their number types)
        raise ValueError(f"no path has {min_count} passes on a host to fit its growth on")
    passes = passes.assign(pass_s=passes["pass_s"] + _knee_saved(passes, serving))  # as priced before the knee
    scales = {**{p: serving.attention_scale[p] for p in passes["path"].unique()},
              **(_attention_scales(passes, min_count) if attention else {})}
    inherited = {alone for alone, base in PREFILL_PATHS.items() if alone in scales and base in scales} \
        if attention else set()
    scales.update({alone: scales[PREFILL_PATHS[alone]] for alone in inherited})
    model_s = _swept_steps(passes, scales) * _bucket_factors(passes, serving)
    rows = _finite_rows(passes.assign(ratio=passes["pass_s"] / model_s), "ratio", "heat")
    shown, fit = {}, {}
    for path, part in rows.groupby("path"):
        slopes = {host: _heat_slope(g["heat"].to_numpy(), g["ratio"].to_numpy())
                  for host, g in part.groupby("host") if len(g) >= min_count}
        shown[path] = [s for s in slopes.values() if s is not None]
        fit[path] = {"n": int(len(part)), "heat_hosts": len(shown[path]), "heat_before": serving.heat_scale[path],
                     "attention_before": serving.attention_scale[path], "host_heat": slopes,
                     **({} if attention else {"attention_kept": True})}
    if not fit:
        raise ValueError(f"no path has {min_count} passes on a host to fit its growth on")
    heat = {path: float(np.median(shown[path])) for path in fit if shown[path]}
    for path in fit.keys() - heat.keys():
        base = PREFILL_PATHS.get(path)
        heat[path] = heat[base] if base in heat else serving.heat_scale[path]
        if base in heat:
            fit[path]["heat_from"] = base
    for path in fit.keys() & inherited:
        fit[path]["attention_from"] = PREFILL_PATHS[path]
    return {p: scales[p] for p in fit}, heat, fit


def _line(x, y, name: str) -> tuple[float, float, dict]:
    """Non-negative least squares line through (x, y), on absolute values; (intercept, slope, fit summary)."""
    from scipy.optimize import lsq_linear

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    A = np.column_stack([np.ones_like(x), x])
    # one x value pins no slope: the level alone
    coef = lsq_linear(A, y, bounds=(0.0, np.inf)).x if len(np.unique(x)) > 1 else np.array([np.median(y), 0.0])
    residual = np.abs(y - A @ coef)
    return float(coef[0]), float(coef[1]), {"n": int(len(y)), "x_range": [float(x.min()), float(x.max())],
                                            "median_abs_residual_s": float(np.median(residual)),
                                            "p95_abs_residual_s": float(np.percentile(residual, 95))}


def _finite(*columns) -> list[np.ndarray]:
    arrays = [np.asarray(c, dtype=float) for c in columns]
    keep = np.logical_and.reduce([np.isfinite(a) for a in arrays])
    return [a[keep] for a in arrays]


def _finite_rows(frame, *columns):
    """The rows of ``frame`` whose ``columns`` are all finite."""
    return frame[np.isfinite(frame[list(columns)].to_numpy(dtype=float)).all(axis=1)]


def _host_medians(rows, fit_host):
    """Each host weighs as one, however many passes it ran: ``fit_host`` of each host's ``rows`` (a frame of
    numbers indexed by what hosts share, such as the loop's bins), then per index the median over the hosts that
    have it.
    Returns (the medians, the hosts' fits indexed by (host, index))."""
    import pandas as pd

    # no rows: one empty fit, which has the fit's columns
    fits = {host: fit_host(part) for host, part in rows.groupby("host")} or {"": fit_host(rows)}
    per_host = pd.concat(fits, names=["host"])
    return per_host.groupby(level=1).median(), per_host


def _distribution(values: np.ndarray) -> list[float]:
    """``QUANTILES`` points of the distribution of ``values`` (mid-quantiles), clipped at 0."""
    return np.maximum(np.quantile(values, (np.arange(QUANTILES) + 0.5) / QUANTILES), 0.0).tolist()


def fit_serving(passes, requests, source: Mapping | None = None, min_count: int = 10) -> ServingModel:
    """A ``ServingModel`` from served measurements. ``passes``: rows (mappings or a DataFrame) with ``path``,
    ``pass_s`` (the served step), ``model_s`` (the profile's prediction of it), ``num_samples``, ``serving_s``
    (the loop's work before the next step; NaN where the engine then idled) and optionally ``spread_tokens``
    (``decode_spread_tokens``; 0 where missing), ``prefill_tokens`` (0 where missing: a decode step) and ``heat``
    (``prefill_heats`` with ``HEAT_TAU_S``; where missing, or where a path's passes span too little of it, the path's
    scale is a constant). ``requests``: rows with ``prompt_tokens``, ``admission_s``, ``delivery_s`` and
    ``num_samples`` (sampled entries of the pass that made the delivered token), and optionally ``light`` (sent to a
    lightly loaded server; NaN delivery). Admission's growth
    with prompt length (from the other rows, an open-loop flood's), and delivery's with the pass's sampled entries,
    are lines through the medians of ten bins (robust to the tail); what is left of admission is kept as its
    measured distribution, from the light rows where there are ``min_count`` of them, and of delivery the
    intercept.

    Passes may carry a ``host``: where they name several, each host weighs as one, however many passes it ran, in
    each path's scale and heat growth (``_path_scales``) and in the loop (``_host_medians``). The spreads, admission
    and delivery stay pooled by pass: small terms and measured distributions."""
    import pandas as pd

    passes = pd.DataFrame(passes, columns=["path", "pass_s", "model_s", "num_samples", "serving_s", "spread_tokens",
                                           "heat", "host", "attention_s", "prefill_tokens"])
    passes["spread_tokens"] = passes["spread_tokens"].fillna(0.0)
    passes["prefill_tokens"] = passes["prefill_tokens"].fillna(0)
    passes["attention_s"] = passes["attention_s"].fillna(0.0)
    passes["heat"] = passes["heat"].fillna(0.0)
    passes["host"] = passes["host"].astype(object).fillna("")  # rows without a host: one host
    several_hosts = passes["host"].nunique() > 1
    requests = pd.DataFrame(requests, columns=["prompt_tokens", "admission_s", "delivery_s", "num_samples", "light"])
    light = requests.pop("light").eq(True).to_numpy()
    attention_scale = _attention_scales(passes, min_count)
    passes["model_s"] = _swept_steps(passes, attention_scale)
    scale, heat_scale, scale_fit = _path_scales(passes, min_count, several_hosts)
    decodes_only = passes["prefill_tokens"] == 0
    spread_s, spread_fit = _spread(passes[decodes_only], scale, heat_scale, min_count)
    mixed_spread_s, mixed_spread_fit = _spread(passes[~decodes_only], scale, heat_scale, min_count)
    busy = _finite_rows(passes, "num_samples", "serving_s")
    prompts, admission = _finite(requests["prompt_tokens"][~light], requests["admission_s"][~light])
    light_prompts, light_admission = _finite(requests["prompt_tokens"][light], requests["admission_s"][light])
    sampled, delivery = _finite(requests["num_samples"], requests["delivery_s"])
    for name, n in (("loop", len(busy)), ("admission", len(admission)), ("delivery", len(delivery))):
        if n < min_count:
            raise ValueError(f"fitting the serving {name} needs at least {min_count} measurements, got {n}"
                             + ("" if name == "loop" else " (requests come from open-loop overload runs, which a "
                                                          "grid of --loads makes)"))
    per_pass, per_sample, knee, above, loop_fit = _loop_line(busy, several_hosts)
    _, per_token, _ = _line(*_bin_medians(prompts, admission), "admission")
    admitted_by = "light load" if len(light_admission) >= min_count else "overload"
    if admitted_by == "light load":
        flood, prompts, admission = admission, light_prompts, light_admission
    left = admission - per_token * prompts
    delivery_base, delivery_per_sample, delivery_fit = _line(*_bin_medians(sampled, delivery), "delivery")
    fit = {"path_scale": scale_fit, "decode_spread": spread_fit, "mixed_spread": mixed_spread_fit, "loop": loop_fit,
           "admission": {"n": int(len(admission)), "source": admitted_by, "p50_s": float(np.median(admission)),
                         "mean_s": float(admission.mean()), "p90_s": float(np.percentile(admission, 90)),
                         **({"overload_mean_s": float(flood.mean())} if admitted_by == "light load" else {})},
           "delivery": {"n": int(len(delivery)), "p50_s": float(np.median(delivery)),
                        "mean_s": float(delivery.mean()), "p90_s": float(np.percentile(delivery, 90)),
                        "samples_range": delivery_fit["x_range"]},
           **(source or {})}
    return ServingModel(per_pass, per_sample, per_token, _distribution(left), [delivery_base], scale, fit,
                        delivery_per_sample, spread_s, heat_scale, HEAT_TAU_S, knee, above, attention_scale,
                        mixed_spread_s)


def fit_loop(passes, min_count: int = 10) -> tuple[float, float, float, float, dict]:
    """(per pass, per sampled entry, knee, further per entry past it, fit summary) of the serving loop's work, as
    ``fit_serving`` fits it (``_loop_line``, each host weighing as one), alone: for a section whose loop was
    measured on other hosts or an older engine. ``passes``: rows with ``num_samples``, ``serving_s`` and ``host``
    (``fit_serving``'s)."""
    import pandas as pd

    passes = pd.DataFrame(passes, columns=["num_samples", "serving_s", "host"])
    passes["host"] = passes["host"].astype(object).fillna("")
    busy = _finite_rows(passes, "num_samples", "serving_s")
    if len(busy) < min_count:
        raise ValueError(f"fitting the serving loop needs at least {min_count} measurements, got {len(busy)}")
    return _loop_line(busy, busy["host"].nunique() > 1)


LOOP_BIN = 16  # sampled entries a bin of the loop's fit spans
MIN_BIN_PASSES = 5  # passes a bin needs to count
MIN_BIN_HOSTS = 0.5  # share of the hosts a bin needs to count, where several: not one host's few largest batches


def _loop_bins(passes, column: str = "serving_s"):
    """The medians of sampled entries (``x``) and ``column`` (``y``; the loop's work) of ``passes`` in each bin of
    ``LOOP_BIN`` entries that has ``MIN_BIN_PASSES`` of them, indexed by bin."""
    import pandas as pd

    samples = passes["num_samples"].to_numpy(dtype=float)
    frame = pd.DataFrame({"x": samples, "y": passes[column].to_numpy(dtype=float),
                          "bin": (samples // LOOP_BIN).astype(np.int64)})
    grouped = frame.groupby("bin")
    return grouped.median()[grouped.size() >= MIN_BIN_PASSES]


def _loop_line(passes, several_hosts: bool) -> tuple[float, float, float, float, dict]:
    """(per pass, per sampled entry, knee, further per entry from the knee on, fit summary) of the loop's work on
    ``passes`` (finite ``num_samples`` and ``serving_s``): the convex broken line, knee on a multiple of
    ``LOOP_BIN`` with two bins or more past it, that fits best (least squares, every term at least 0) the medians of
    bins of ``LOOP_BIN`` entries, each bin's point the median of its hosts' medians (``_host_medians``), over the
    bins that ``MIN_BIN_HOSTS`` of the hosts have. Medians, so that the odd slow pass does not bend the line, and
    bins, so that the thousands of passes an overload run makes at the engine's largest batch do not outweigh the
    range that cells below saturation run in."""
    from scipy.optimize import lsq_linear

    samples, serving = passes["num_samples"].to_numpy(dtype=float), passes["serving_s"].to_numpy(dtype=float)
    medians, per_host = _host_medians(passes, _loop_bins)
    if several_hosts:
        covered = per_host.groupby(level=1).size() >= MIN_BIN_HOSTS * passes["host"].nunique()
        medians = medians[covered.reindex(medians.index, fill_value=False)]
    if len(medians) < 3:  # too few bins to bend: one line through every host's passes
        per_pass, per_sample, summary = _line(samples, serving, "loop")
        return per_pass, per_sample, 0.0, 0.0, summary
    x, y = medians["x"].to_numpy(), medians["y"].to_numpy()
    best = None
    # a knee needs two bins past it: one bin's few passes would set any slope there
    for knee in [0.0, *np.arange(2 * LOOP_BIN, np.sort(x)[-2], LOOP_BIN)]:
        A = np.column_stack([np.ones_like(x), x, np.maximum(0.0, x - knee) if knee else np.zeros_like(x)])
        coef = lsq_linear(A, y, bounds=(0.0, np.inf)).x
        sse = float(np.sum((y - A @ coef) ** 2))
        if best is None or sse < best[0] - 1e-15:
            best = (sse, float(knee) if coef[2] > 0 else 0.0, coef)
    _, knee, (per_pass, per_sample, above) = best
    residual = np.abs(serving - (per_pass + per_sample * samples + above * np.maximum(0.0, samples - knee)))
    return float(per_pass), float(per_sample), knee, float(above), {
        "n": int(len(serving)), "x_range": [float(samples.min()), float(samples.max())], "bins": int(len(x)),
        "median_abs_residual_s": float(np.median(residual)), "p95_abs_residual_s": float(np.percentile(residual, 95)),
        **({"hosts": per_host.index.get_level_values(0).nunique()} if several_hosts else {})}


MIN_HEAT_RANGE = 0.2  # a path's passes must span this much heat (p10 to p90) to fit its growth with it
MIN_ATTENTION_RANGE = 0.05  # nor its attention growth under this span of attention's share of the step (p10 to p90)
FIT_NOISE = 0.02  # a served / swept step this far off a robust fit's line weighs less in it


def _robust_fit(X: np.ndarray, y: np.ndarray, start: np.ndarray, scale: np.ndarray | float = 1.0) -> np.ndarray:
    """The coefficients c of y = X c, from ``start``, each residual a share of ``scale``, robust to the odd pass
    timed apart from its work (a Cauchy loss past ``FIT_NOISE``)."""
    from scipy.optimize import least_squares

    return least_squares(_scaled_residual, start, loss="cauchy", f_scale=FIT_NOISE, args=(X, y, scale)).x


def _scaled_residual(c: np.ndarray, X: np.ndarray, y: np.ndarray, scale) -> np.ndarray:
    return (X @ c - y) / scale


def _attention_scales(passes, min_count: int) -> dict[str, float]:
    """{path: attention_scale} where hosts show it: each host with ``min_count`` finite passes of the path spanning
    ``MIN_ATTENTION_RANGE`` of attention's share of the swept step fits served / swept = a + b x heat + c x share
    (no heat term where they span under ``MIN_HEAT_RANGE`` of it, which the level alone then carries) by least
    squares, robust to the odd pass timed apart from its work, and its scale is c / a (what the attention costs
    served beyond the sweep's price, as a share of that price); the path's, the median over those hosts, at least
    0. Paths no host shows are left out."""
    ratio, share = passes["pass_s"] / passes["model_s"], passes["attention_s"] / passes["model_s"]
    rows = _finite_rows(passes.assign(ratio=ratio, share=share), "ratio", "share", "heat")
    scales = {}
    for path, part in rows[rows["share"] > 0].groupby("path"):
        fits = []
        for _, host in part.groupby("host"):
            x, heat, y = host["share"].to_numpy(), host["heat"].to_numpy(), host["ratio"].to_numpy()
            if len(host) < min_count or np.percentile(x, 90) - np.percentile(x, 10) < MIN_ATTENTION_RANGE:
                continue
            spans_heat = np.percentile(heat, 90) - np.percentile(heat, 10) >= MIN_HEAT_RANGE
            A = np.column_stack([np.ones_like(x), heat, x] if spans_heat else [np.ones_like(x), x])
            start = np.zeros(A.shape[1])
            start[0] = np.median(y)  # (a start off the bulk can lead the robust loss to a far minimum)
            coef = _robust_fit(A, y, start)
            fits.append(coef[-1] / coef[0])
        if fits:
            scales[path] = max(0.0, float(np.median(fits)))
    return scales


def _path_scales(passes, min_count: int, several_hosts: bool) -> tuple[dict, dict, dict]:
    """({path: scale at heat 0}, {path: growth per unit of heat}, {path: fit summary}) of the served / swept step,
    over the hosts with ``min_count`` finite passes of the path, each host weighing as one: the growth is the median
    of the growths of the hosts whose passes span the heat (``_heat_slope``; 0 where none does), the scale the median
    over hosts of each one's median ratio less that growth. So a host that ran hot only still sets the level, and a
    host with more runs weighs no more. The scale describes the passes the swept model covers: passes whose decodes
    have a spread of contexts are priced apart (``_spread``)."""
    import pandas as pd

    swept = _finite_rows(passes[passes["spread_tokens"] == 0].assign(ratio=passes["pass_s"] / passes["model_s"]),
                         "ratio", "heat")
    scale, heat_scale, summary = {}, {}, {}
    for path, part in swept.groupby("path"):
        hosts = {host: rows for host, rows in part.groupby("host") if len(rows) >= min_count}
        if not hosts:
            continue
        slopes = [s for s in (_heat_slope(rows["heat"].to_numpy(), rows["ratio"].to_numpy())
                              for rows in hosts.values()) if s is not None]
        slope = float(np.median(slopes)) if slopes else 0.0
        levels = _host_levels(hosts, slope)
        scale[path], heat_scale[path] = float(np.median(list(levels.values()))), slope
        used = pd.concat(hosts.values())
        summary[path] = _heat_summary(used["heat"].to_numpy(), used["ratio"].to_numpy(), scale[path], slope)
        if several_hosts:
            summary[path].update(hosts=len(levels), host_levels=levels)
    return scale, heat_scale, summary


def _host_levels(hosts: Mapping, slope: float) -> dict[str, float]:
    """{host: its level at heat 0}: the median of its passes' served / swept ``ratio`` less ``slope`` x heat."""
    return {host: float(np.median(rows["ratio"] - slope * rows["heat"])) for host, rows in hosts.items()}


def _heat_slope(heat: np.ndarray, ratio: np.ndarray) -> float | None:
    """The growth per unit of heat of one host's served / swept steps of a path: the Theil-Sen slope (robust to the
    odd slow pass), at least 0 (a hotter card never runs faster); None where the passes span under
    ``MIN_HEAT_RANGE`` of heat."""
    from scipy.stats import theilslopes

    if np.percentile(heat, 90) - np.percentile(heat, 10) < MIN_HEAT_RANGE:
        return None
    step = max(1, len(ratio) // 2000)  # every step-th pass: the line costs pairs of passes
    return max(0.0, float(theilslopes(ratio[::step], heat[::step])[0]))


def _heat_summary(heat: np.ndarray, ratio: np.ndarray, level: float, slope: float) -> dict:
    """How the line ``level + slope x heat`` fits a path's served / swept steps ``ratio``."""
    residual = np.abs(ratio / (level + slope * heat) - 1.0)
    return {"n": int(len(ratio)), "p10": float(np.percentile(ratio, 10)), "p90": float(np.percentile(ratio, 90)),
            "heat_p10": float(np.percentile(heat, 10)), "heat_p90": float(np.percentile(heat, 90)),
            "median_abs_residual": float(np.median(residual)),
            "median_abs_residual_constant": float(np.median(np.abs(ratio / np.median(ratio) - 1.0)))}


def _spread(passes, scale: Mapping[str, float], heat_scale: Mapping[str, float], min_count: int) -> tuple[float, dict]:
    """The price per token of the decodes' spread of contexts (``decode_spread_s`` of decode steps,
    ``mixed_spread_s`` of passes with prompt tokens, as ``passes`` hold): least squares through 0 of what each path's
    scale leaves of the passes with such a spread, against it (0 with fewer than ``min_count`` of them); and its fit
    summary."""
    passes = passes[passes["spread_tokens"] > 0]
    scale_of = passes["path"].map(lambda p: scale.get(p, 1.0)).to_numpy(dtype=float)
    heat_of = passes["path"].map(lambda p: heat_scale.get(p, 0.0)).to_numpy(dtype=float)
    left = passes["pass_s"].to_numpy(dtype=float) - (scale_of + heat_of * passes["heat"].to_numpy(dtype=float)) * \
        passes["model_s"].to_numpy(dtype=float)
    x, y = _finite(passes["spread_tokens"], left)
    if len(x) < min_count:
        return 0.0, {"n": int(len(x)), "knee": SPREAD_KNEE}
    per_token = max(0.0, float(x @ y / (x @ x)))
    return per_token, {"n": int(len(x)), "knee": SPREAD_KNEE, "spread_range": [float(x.min()), float(x.max())],
                       "median_abs_residual_s": float(np.median(np.abs(y - per_token * x)))}


def _bin_medians(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The medians of ``x`` and ``y`` in (up to) ten quantile bins of ``x``."""
    import pandas as pd

    bins = pd.qcut(x, min(10, len(np.unique(x))), duplicates="drop")
    medians = pd.DataFrame({"x": x, "y": y}).groupby(bins, observed=True).median()
    return medians["x"].to_numpy(), medians["y"].to_numpy()
