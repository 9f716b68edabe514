"""Summaries of a replication: latency percentiles, throughput, FastGen effective throughput and goodput.

FastGen (DeepSpeed-MII's benchmark): a request meets the SLA when its first token comes within
``prompt_tokens / 512`` s and the EWM (span 16) of its inter-token gaps stays below ``1 / rate`` (or, in the
cumulative variant, token k comes within ``k / rate`` of the first). Throughput is requests / (last finish -
first arrival); effective throughput = throughput x share meeting the SLA.
Goodput (as ``vllm bench serve --goodput``): requests/s meeting every given TTFT/TPOT/e2e limit.
Energy (where the result has it: a simulation, NaN on a profile without energy figures): the fleet's joules from
the first arrival to the last finish of the whole run (warm-up and cool-down included: passes are not attributed to
requests), as ``energy_kwh``, ``fleet_power_w`` (its mean power) and ``energy_per_request_j`` (per request run).
Steady state: ``arrival_rate_rps`` and ``completion_rate_rps`` are the rates of the measured requests' arrivals
and finishes (inverse least-squares slopes of their sorted times); a run whose queue grows finishes requests
slower than they arrive. ``audit_frame`` is ``requests.csv``: every per-request number the summary is made of.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from sim.units import describe, format_value

SUMMARY_KEYS = [  # the rows a run's summary table shows (simulate and bench)
    "requests", "throughput_rps", "token_throughput_tps", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95",
    "itl_p95", "itl_p99", "e2e_p50", "e2e_p99", "queue_delay_mean", "sla_share", "effective_throughput_rps",
    "goodput_rps", "preemptions", "mean_busy_share", "mean_tokens_per_pass", "energy_per_request_j", "fleet_power_w",
    "energy_kwh", "failed"]

GENERATION_RATES = (1, 2, 3, 4, 6, 8)
PERCENTILES = (50, 90, 95, 99)


@dataclass
class SLA:
    prompt_tokens_per_s: float = 512.0
    generation_rate: float = 4.0  # tokens/s for the headline effective throughput
    cumulative: bool = False
    goodput: dict = field(default_factory=dict)  # {"ttft": s, "tpot": s, "e2e": s}

    def __post_init__(self) -> None:
        if not self.prompt_tokens_per_s > 0 or not self.generation_rate > 0:
            raise ValueError("--sla-prompt-rate and --sla-gen-rate must be > 0")
        bad = [k for k in self.goodput if k not in ("ttft", "tpot", "e2e")]
        if bad:
            raise ValueError(f"SLA.goodput: unknown metric {bad[0]!r}; use ttft, tpot or e2e (seconds)")


GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e", "e2e": "e2e"}  # vLLM's name -> SLA.goodput's


def parse_goodput(spec) -> dict:
    """``vllm bench serve --goodput``'s limits: space-separated KEY:MILLISECONDS pairs (one string or a list of
    them), KEY ttft, tpot or e2el (e2e too) -> ``SLA.goodput`` ({"ttft": 0.2, "tpot": 0.05}, seconds).
    ``"ttft:200 tpot:50"`` means TTFT <= 200 ms and TPOT <= 50 ms, as in vLLM."""
    if not spec:
        return {}
    text = spec if isinstance(spec, str) else " ".join(spec)
    form = "space-separated KEY:MILLISECONDS pairs as in vllm bench serve, e.g. --goodput ttft:200 tpot:50"
    if "," in text:
        raise ValueError(f"--goodput {text!r}: expected {form} (not comma-separated seconds)")
    out = {}
    for part in text.split():
        key, _, value = part.partition(":")
        if key not in GOODPUT_KEYS:
            raise ValueError(f"--goodput {text!r}: unknown metric {key!r}; use ttft, tpot or e2el ({form})")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {text!r}: {part!r} is not KEY:MILLISECONDS; expected {form}") from None
        if not ms >= 0:
            raise ValueError(f"--goodput {text!r}: {key} must be >= 0 ms, got {value}")
        out[GOODPUT_KEYS[key]] = ms / 1e3
    return out


def meets_fastgen_sla(df, rate: float, sla: SLA) -> np.ndarray:
    """Boolean per request of ``df`` (a requests frame or its numpy columns): prompt SLA and generation SLA at
    ``rate``."""
    prompt_ok = np.asarray(df["ttft"]) <= np.asarray(df["prompt_tokens"]) / sla.prompt_tokens_per_s
    if sla.cumulative:
        gen_ok = np.asarray(df["max_mean_gap"]) <= 1.0 / rate
    else:
        gen_ok = np.asarray(df["max_ewm_gap"]) < 1.0 / rate
    return prompt_ok & gen_ok


def summarize(result, sla: SLA | None = None, keep=None) -> dict:
    """One flat dict of the measured requests (warm-up/cool-down left out) of a ``SimResult`` or of a server's
    ``sim.bench.MeasuredRun``: their ``columns`` (as ``RequestLog.to_columns`` makes them), ``log.gaps``,
    ``replica_rows`` and ``seed``. ``keep``: a boolean mask of the requests to summarize instead (for example
    ``sim.steady_state.steady_window``; the inter-token histogram stays that of the measured requests)."""
    sla = sla or SLA()
    cols = result.columns
    keep = cols["measured"] if keep is None else np.asarray(keep, dtype=bool)
    m = {name: col[keep] for name, col in cols.items()}
    n = int(keep.sum())
    span = float(m["finish"].max() - m["arrival"].min()) if n else float("nan")
    throughput = n / span if n and span > 0 else float("nan")
    out = {"seed": result.seed, "requests": n, "duration_s": span, "throughput_rps": throughput,
           "token_throughput_tps": float(m["output_tokens"].sum()) / span if n else float("nan"),
           "prompt_throughput_tps": float(m["prompt_tokens"].sum()) / span if n else float("nan"),
           "arrival_rate_rps": event_rate(m["arrival"]), "completion_rate_rps": event_rate(m["finish"])}
    for metric in ("ttft", "tpot", "e2e", "queue_delay"):
        values = m[metric][~np.isnan(m[metric])]
        out[f"{metric}_mean"] = float(values.mean()) if values.size else float("nan")
        for q in PERCENTILES:
            out[f"{metric}_p{q}"] = float(np.percentile(values, q)) if values.size else float("nan")
    gaps = result.log.gaps
    out["itl_mean"] = gaps.mean()
    for q in PERCENTILES:
        out[f"itl_p{q}"] = gaps.percentile(q)
    for rate in sla_rates(sla):
        share = float(meets_fastgen_sla(m, rate, sla).mean()) if n else float("nan")
        out[f"sla_share@{rate:g}"] = share
        out[f"effective_throughput@{rate:g}"] = throughput * share
    out["sla_share"] = out[f"sla_share@{sla.generation_rate:g}"]
    out["effective_throughput_rps"] = out[f"effective_throughput@{sla.generation_rate:g}"]
    if sla.goodput:
        good = meets_goodput(m, sla)
        out["goodput_rps"] = float(good.sum()) / span if n else float("nan")
        out["goodput_share"] = float(good.mean()) if n else float("nan")
    reps = result.replica_rows
    passes = np.array([r["passes"] for r in reps])
    out["preemptions"] = int(np.sum([r["preemptions"] for r in reps]))
    out["mean_busy_share"] = float(np.mean([r["busy_share"] for r in reps]))
    out["mean_tokens_per_pass"] = float(np.sum(np.array([r["mean_tokens_per_pass"] for r in reps]) * passes)
                                        / max(int(passes.sum()), 1))
    energy = getattr(result, "energy_j", None)
    if energy is not None:
        run = len(cols["id"])
        run_span = float(cols["finish"].max() - cols["arrival"].min()) if run else float("nan")
        out["energy_kwh"] = energy / 3.6e6
        out["fleet_power_w"] = energy / run_span if run and run_span > 0 else float("nan")
        out["energy_per_request_j"] = energy / run if run else float("nan")
    return out


def event_rate(times) -> float:
    """Events per second: the inverse least-squares slope of the sorted event times against their rank (NaN for
    fewer than 3 events)."""
    t = np.sort(np.asarray(times, dtype=float))
    if t.size < 3:
        return float("nan")
    slope = np.polyfit(np.arange(t.size), t, 1)[0]
    return float(1.0 / slope) if slope > 0 else float("nan")


def sla_rates(sla: SLA) -> list[float]:
    """The generation rates (tokens/s) a summary judges: FastGen's 1-8 and the SLA's own."""
    return sorted(set(GENERATION_RATES) | {sla.generation_rate})


def audit_frame(result, sla: SLA | None = None):
    """One row per request with the times (s) and SLA verdicts its summary is computed from: ``requests.csv``.

    ``max_ewm_gap_s`` / ``max_mean_gap_s`` are the generation-SLA statistics (EWM, cumulative; the one in use is
    compared with 1 / rate), ``prompt_sla_s`` the prompt SLA's limit on TTFT, ``meets_sla@R`` the verdict at R
    tokens/s. The summary's percentiles and shares are those of the rows with ``measured`` true."""
    import pandas as pd

    sla = sla or SLA()
    c = result.columns
    df = pd.DataFrame({name: c[name] for name in ("id", "replica") if name in c})
    df["measured"] = c["measured"]
    for name in ("arrival", "scheduled", "first_token", "finish"):
        df[f"{name}_s"] = c[name]
    for name in ("prompt_tokens", "output_tokens", "cached_tokens", "preemptions"):
        if name in c:
            df[name] = c[name]
    for name in ("ttft", "tpot", "e2e", "queue_delay", "max_ewm_gap", "max_mean_gap"):
        df[f"{name}_s"] = c[name]
    df["prompt_sla_s"] = c["prompt_tokens"] / sla.prompt_tokens_per_s
    df["meets_prompt_sla"] = c["ttft"] <= df["prompt_sla_s"].to_numpy()
    for rate in sla_rates(sla):
        df[f"meets_sla@{rate:g}"] = meets_fastgen_sla(c, rate, sla)
    if sla.goodput:
        df["meets_goodput"] = meets_goodput(c, sla)
    return df


def meets_goodput(columns, sla: SLA) -> np.ndarray:
    """Boolean per request: every goodput limit of ``sla`` met (a NaN TPOT, one output token, passes)."""
    good = np.ones(len(columns["ttft"]), dtype=bool)
    for metric, limit in sla.goodput.items():
        good &= ~(np.asarray(columns[metric]) > limit)
    return good


def t_interval(values, axis: int = 0, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and Student-t confidence interval of independent replications along ``axis`` (NaN bounds for one).
    Unbounded: for differences and decisions; an interval of a metric that is shown uses ``mean_interval``."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    k = x.shape[axis]
    mean = x.mean(axis=axis)
    if k < 2:
        return mean, mean * np.nan, mean * np.nan
    half = stats.t.ppf(0.5 + level / 2, k - 1) * x.std(axis=axis, ddof=1) / np.sqrt(k)
    return mean, mean - half, mean + half


BOOTSTRAP_RESAMPLES = 2000
FEW_REPLICATIONS = 5  # below this many, intervals over replications are rough (a percentile bootstrap too narrow)


def few_replications_warning(replications: int) -> str | None:
    """The line to print under intervals over ``replications`` runs, if they are too few to trust."""
    if 1 < replications < FEW_REPLICATIONS:
        return (f"warning: intervals over {replications} replications are rough (too narrow); use "
                f"--replications {FEW_REPLICATIONS} or more")
    return None


def mean_interval(values, axis: int = 0, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean of independent replications along ``axis`` and its percentile-bootstrap interval (seeded, so
    repeatable): a mean of resampled replications never leaves the range of the replications, so a share's interval
    stays in [0, 1] and a count's at >= 0. NaN bounds for one replication. Few replications give too narrow an
    interval: callers warn below ``sim.capacity.FEW_REPLICATIONS``."""
    from scipy import stats

    x = np.moveaxis(np.asarray(values, dtype=float), axis, 0)
    mean = x.mean(axis=0)
    if x.shape[0] < 2:
        return mean, mean * np.nan, mean * np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # replications that all agree: a degenerate (zero-width) interval is right
        ci = stats.bootstrap((x,), np.mean, axis=0, method="percentile", confidence_level=level,
                             n_resamples=BOOTSTRAP_RESAMPLES, vectorized=True,
                             random_state=np.random.default_rng(0)).confidence_interval
    low = np.clip(ci.low, x.min(axis=0), x.max(axis=0))  # the percentile of a mean, less its float rounding
    high = np.clip(ci.high, x.min(axis=0), x.max(axis=0))
    return mean, low, high


def confidence_intervals(summaries, level: float = 0.95):
    """Mean and percentile-bootstrap interval (``mean_interval``) of each numeric summary column over independent
    replications: inside each metric's range."""
    import pandas as pd

    df = pd.DataFrame(summaries).drop(columns=["seed"], errors="ignore")
    df = df.select_dtypes("number")
    mean, low, high = mean_interval(df.to_numpy(dtype=float), level=level)
    return pd.DataFrame({"mean": mean, "ci_low": low, "ci_high": high, "replications": len(df)}, index=df.columns)


def summary_table(summaries, keys=SUMMARY_KEYS, level: float = 0.95):
    """The summary ``keys`` (those present) as a table to print or show: one row per key, named with its unit
    (``sim.units``), holding the value of one replication, or the mean and confidence interval of several (a
    percentile-bootstrap one: within the metric's range)."""
    import pandas as pd

    keys = [k for k in keys if k in summaries[0]]
    index = pd.Index([describe(k)[0] for k in keys], name="metric")
    if len(summaries) == 1:
        return pd.DataFrame({"value": [format_value(k, summaries[0][k]) for k in keys]}, index=index)
    ci = confidence_intervals(summaries, level)
    return pd.DataFrame({
        "mean": [format_value(k, ci.loc[k, "mean"]) for k in keys],
        f"{level:.0%} CI": [f"{format_value(k, ci.loc[k, 'ci_low'])} to {format_value(k, ci.loc[k, 'ci_high'])}"
                            for k in keys]}, index=index)
