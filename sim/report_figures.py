"""The figures of ``report.html``, from every replication of a run: latency CDFs, SLA attainment, the load sweep,
per-replica load, tokens per pass and KV use.

Each axis carries one kind of quantity with its unit (latencies in s, rates in req/s, shares in %); a mean over
replications is drawn with its 95% percentile-bootstrap band (none with one replication), which stays in the
quantity's range.
"""

from __future__ import annotations

import numpy as np
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.metrics import mean_interval
from sim.units import LATENCIES, label, scale

COLORS = plotly.colors.qualitative.Plotly
HEIGHT = 380


def _fill(color: str) -> str:
    r, g, b = plotly.colors.hex_to_rgb(color)
    return f"rgba({r},{g},{b},0.2)"


def _band(fig: go.Figure, x, low, high, color: str, name: str, row: int, col: int, horizontal: bool = False) -> None:
    """A shaded interval around a curve: between ``low`` and ``high`` along y (or along x if ``horizontal``)."""
    x, low, high = (np.asarray(v, dtype=float) for v in (x, low, high))
    if not np.isfinite(low).any():
        return
    xs, ys = (np.concatenate([low, high[::-1]]), np.concatenate([x, x[::-1]])) if horizontal else \
        (np.concatenate([x, x[::-1]]), np.concatenate([low, high[::-1]]))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", fill="toself", fillcolor=_fill(color), line={"width": 0},
                             hoverinfo="skip", showlegend=False, name=f"{name} 95% CI"), row=row, col=col)


def _curve(fig, x, runs, color, name, row, col, key: str, mode="lines+markers", showlegend=True, dash=None):
    """The mean over replications (rows of ``runs``: one per replication) of summary ``key`` with its band, shown
    in the key's units (shares in %)."""
    mean, low, high = mean_interval(np.asarray(runs, dtype=float))
    mean, low, high = (v * scale(key) for v in (mean, low, high))
    _band(fig, x, low, high, color, name, row, col)
    fig.add_trace(go.Scatter(x=x, y=mean, mode=mode, name=name, line={"color": color, "dash": dash},
                             legendgroup=name, showlegend=showlegend), row=row, col=col)


def latency_cdfs(results, points: int = 200) -> go.Figure:
    """One panel per latency (own x axis in s): the CDF over measured requests from the 0.5th to the 99.5th
    percentile, mean quantiles over replications with a band."""
    metrics = list(LATENCIES)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[f"{LATENCIES[m]} (s)" for m in metrics],
                        horizontal_spacing=0.05)
    probs = np.linspace(0.005, 0.995, points)  # the extremes of a sample are too noisy to average
    for col, metric in enumerate(metrics, start=1):
        runs = []
        for r in results:
            if metric == "itl":  # inter-token gaps live in a histogram, not in per-request columns
                runs.append([r.log.gaps.percentile(100 * p) for p in probs])
            else:
                values = r.columns[metric][r.columns["measured"]]
                values = values[~np.isnan(values)]
                runs.append(np.quantile(values, probs) if values.size else np.full(points, np.nan))
        mean, low, high = mean_interval(np.asarray(runs))
        color = COLORS[col - 1]
        _band(fig, 100 * probs, low, high, color, metric, 1, col, horizontal=True)
        fig.add_trace(go.Scatter(x=mean, y=100 * probs, mode="lines", name=LATENCIES[metric],
                                 line={"color": color}), row=1, col=col)
        fig.update_xaxes(title_text=f"{LATENCIES[metric]} (s)", row=1, col=col)
        fig.update_yaxes(title_text=("token gaps" if metric == "itl" else "requests") + " at or below (%)", row=1,
                         col=col)
    fig.update_layout(title="Latency CDFs of measured requests (inter-token latency: every gap)", showlegend=False,
                      height=HEIGHT)
    return fig


def sla_attainment(summaries) -> go.Figure:
    """FastGen's SLA at every generation rate: the share of requests meeting it (%), and effective throughput
    (req/s), in two panels."""
    rates = sla_rates_of(summaries)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Requests meeting the SLA (%)",
                                                        "Effective throughput (req/s)"))
    share = [[s[f"sla_share@{r:g}"] for r in rates] for s in summaries]
    effective = [[s[f"effective_throughput@{r:g}"] for r in rates] for s in summaries]
    _curve(fig, rates, share, COLORS[0], "share meeting the SLA", 1, 1, "sla_share")
    _curve(fig, rates, effective, COLORS[1], "effective throughput", 1, 2, "effective_throughput_rps")
    throughput = [[s["throughput_rps"]] * len(rates) for s in summaries]
    _curve(fig, rates, throughput, COLORS[2], "throughput (all requests)", 1, 2, "throughput_rps", mode="lines")
    fig.update_xaxes(title_text="generation SLA (tokens/s)")
    fig.update_yaxes(title_text=label("sla_share"), range=[0, 105], row=1, col=1)
    fig.update_yaxes(title_text=label("effective_throughput_rps"), rangemode="tozero", row=1, col=2)
    fig.update_layout(title="FastGen SLA (first token within prompt / 512 s, generation at the rate on the x axis)",
                      height=HEIGHT)
    return fig


def sla_rates_of(summaries) -> list[float]:
    """The generation rates the summaries judged (``sla_share@R`` keys)."""
    return sorted(float(k.split("@")[1]) for k in summaries[0] if k.startswith("sla_share@"))


SWEEP_PANELS = [(("ttft_p50", "ttft_p95"), "TTFT (s)"), (("tpot_p50", "tpot_p95"), "TPOT (s)"),
                (("e2e_p50", "e2e_p99"), "end-to-end latency (s)"),
                (("throughput_rps", "effective_throughput_rps"), "throughput (req/s)"),
                (("sla_share",), "requests meeting the SLA (%)"),
                (("mean_tokens_per_pass",), "tokens per pass (tokens)")]


def sweep_curves(sweep) -> go.Figure:
    """The load sweep against the arrival rate: each latency, the rates, the SLA share and the tokens per pass in
    their own panels, each curve the mean over seeds with its band."""
    fig = panel_curves(sweep, "rate", SWEEP_PANELS)
    fig.update_layout(title="Load sweep")
    return fig


def panel_curves(frame, x: str, panels, by: str | None = None, cols: int = 3, seed: str = "seed") -> go.Figure:
    """One panel per (keys, axis title) of ``panels``: for each key (and each group of column ``by``), the mean
    over ``seed`` of the key against ``x`` with its 95% band. Shares show in %. With ``by``, a group keeps its
    colour across panels and a panel's second key is dashed."""
    rows = -(-len(panels) // cols)
    fig = make_subplots(rows=rows, cols=min(cols, len(panels)), subplot_titles=[title for _, title in panels],
                        vertical_spacing=0.16, horizontal_spacing=0.07)
    groups = list(frame.groupby(by, sort=False)) if by else [(None, frame)]
    for i, (keys, title) in enumerate(panels):
        row, col = i // cols + 1, i % cols + 1
        for g, (group, part) in enumerate(groups):
            for j, key in enumerate(keys):
                wide = part.pivot_table(index=x, columns=seed, values=key)
                name = label(key) if group is None else f"{group}" + (f" {label(key)}" if len(keys) > 1 else "")
                color = COLORS[(g if by else 2 * i + j) % len(COLORS)]
                _curve(fig, wide.index.to_numpy(), wide.to_numpy().T, color, name, row, col, key,
                       showlegend=not by or i == 0, dash="dash" if by and j else None)
        fig.update_yaxes(title_text=title, rangemode="tozero", row=row, col=col)
    fig.update_xaxes(title_text=label(x) if x == "rate" else x)
    fig.update_layout(height=rows * HEIGHT)
    return fig


def replica_load(results) -> go.Figure:
    """Per replica: requests, busy time (%), preemptions and peak KV use (%), mean over replications with 95%
    error bars."""
    metrics = [("requests", "requests (count)", 1), ("busy_share", "busy time (%)", 100),
               ("preemptions", "preemptions (count)", 1), ("peak_kv_usage", "peak KV use (%)", 100)]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[m[1] for m in metrics], horizontal_spacing=0.06)
    for col, (metric, title, factor) in enumerate(metrics, start=1):
        runs = np.array([r.replicas.sort_values("replica")[metric].to_numpy(dtype=float) for r in results]) * factor
        mean, low, high = mean_interval(runs)
        error = None if not np.isfinite(low).any() else {"type": "data", "array": high - mean,
                                                         "arrayminus": mean - low}
        fig.add_trace(go.Bar(x=np.arange(runs.shape[1]), y=mean, error_y=error, name=title,
                             marker_color=COLORS[col - 1]), row=1, col=col)
        fig.update_yaxes(title_text=title, row=1, col=col)
    fig.update_xaxes(title_text="replica (index)")
    fig.update_layout(title="Per-replica load", showlegend=False, height=HEIGHT)
    return fig


def tokens_per_pass(results) -> go.Figure:
    total = sum(r.tokens_per_pass.sum(axis=0) for r in results)
    nz = np.flatnonzero(total)
    fig = go.Figure(go.Bar(x=nz, y=total[nz], marker_color=COLORS[0]))
    fig.update_layout(title="Tokens per pass (all replicas and replications)", yaxis_title="passes (count)",
                      xaxis_title="tokens in the pass (tokens)", height=HEIGHT)
    return fig


def kv_usage(result, max_replicas: int = 8, points: int = 2000) -> go.Figure:
    """KV cache use over time of the first replication's first ``max_replicas`` replicas."""
    fig = go.Figure()
    for replica, group in result.kv.groupby("replica"):
        if replica >= max_replicas:
            break
        step = max(1, len(group) // points)
        fig.add_trace(go.Scatter(x=group["time"].to_numpy()[::step], y=100 * group["kv_usage"].to_numpy()[::step],
                                 mode="lines", name=f"replica {replica}"))
    fig.update_layout(title=f"KV cache use over time (seed {result.seed})", xaxis_title="simulated time (s)",
                      yaxis_title="KV blocks in use (%)", yaxis_range=[0, 105], height=HEIGHT)
    return fig
