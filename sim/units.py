"""What each summary key (``sim.metrics.summarize``) means, its unit, and how its value prints: the one table
behind the command-line summaries, ``report.html``, the notebooks' tables and figure axes.

Shares are stored as fractions (0-1) and shown as percentages; counts print with thousands separators, never as
``1e+04``.
"""

from __future__ import annotations

import math

LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "inter-token latency", "e2e": "end-to-end latency",
             "queue_delay": "queueing delay"}
STATISTICS = ("mean", "p50", "p90", "p95", "p99")
COUNTS = ("requests", "preemptions", "seed", "failed", "warmup_requests")
SIGNED = ("queue_growth",)  # may be negative (a queue that drains)

# key -> (what it is, unit)
FIXED = {
    "requests": ("requests measured", "requests"),
    "failed": ("failed requests", "requests"),
    "seed": ("seed", ""),
    "duration_s": ("duration (first arrival to last finish)", "s"),
    "throughput_rps": ("throughput", "req/s"),
    "arrival_rate_rps": ("arrival rate (fitted)", "req/s"),
    "completion_rate_rps": ("completion rate (fitted)", "req/s"),
    "token_throughput_tps": ("output token throughput", "tokens/s"),
    "prompt_throughput_tps": ("prompt token throughput", "tokens/s"),
    "sla_share": ("meeting the FastGen SLA", "%"),
    "effective_throughput_rps": ("effective throughput (FastGen)", "req/s"),
    "goodput_rps": ("goodput", "req/s"),
    "goodput_share": ("meeting the goodput limits", "%"),
    "preemptions": ("preemptions", "count"),
    "mean_busy_share": ("replica busy time", "%"),
    "mean_tokens_per_pass": ("tokens per pass (mean)", "tokens"),
    "rate": ("arrival rate", "req/s"),
    "energy_per_request_j": ("energy per request (whole run)", "J"),
    "fleet_power_w": ("fleet power (mean over the run)", "W"),
    "energy_kwh": ("fleet energy (whole run)", "kWh"),
    "warmup_requests": ("warm-up left out (MSER-5)", "requests"),
    "queue_growth": ("queueing delay growth", "s/s"),
    "achieved_ratio": ("completion rate / arrival rate", "ratio"),
}


def describe(key: str) -> tuple[str, str]:
    """(what the key is, its unit); KeyError for a key this table does not know."""
    if key in FIXED:
        return FIXED[key]
    base, _, rate = key.partition("@")
    if rate:
        if base == "sla_share":
            return f"meeting the FastGen SLA at {rate} tokens/s", "%"
        if base == "effective_throughput":
            return f"effective throughput at {rate} tokens/s", "req/s"
    metric, _, stat = key.rpartition("_")
    if metric in LATENCIES and stat in STATISTICS:
        return f"{LATENCIES[metric]} {stat}", "s"
    raise KeyError(f"no unit known for summary key {key!r}: add it to sim/units.py")


def unit(key: str) -> str:
    return describe(key)[1]


def label(key: str) -> str:
    """``"TTFT p95 (s)"``: what an axis or a table row shows."""
    what, u = describe(key)
    return f"{what} ({u})" if u else what


def bounds(key: str) -> tuple[float, float]:
    """The range a key's true value lies in (stored units): shares in [0, 1], a trend any real number, every other
    metric >= 0."""
    if key in SIGNED:
        return (-math.inf, math.inf)
    return (0.0, 1.0) if unit(key) == "%" else (0.0, math.inf)


def scale(key: str) -> float:
    """Factor from the stored value to the shown one (100 for shares)."""
    return 100.0 if unit(key) == "%" else 1.0


def format_value(key: str, value) -> str:
    """The value as shown, with its unit: ``"10,000 requests"``, ``"97.3%"``, ``"0.5231 s"``."""
    u = unit(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if key in COUNTS:
        return f"{int(round(value)):,}" + (f" {u}" if u not in ("", "count") else "")
    if u == "%":
        return f"{100 * value:.1f}%"
    return f"{number(value)} {u}"


def number(value: float) -> str:
    """Four significant digits, without exponents for large values."""
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
