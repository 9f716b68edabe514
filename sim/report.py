"""``report.html``: plotly figures of one replication (and of a load sweep when there is one)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def latency_cdfs(requests) -> go.Figure:
    m = requests[requests["measured"]]
    fig = make_subplots(rows=1, cols=4, subplot_titles=("TTFT (s)", "TPOT (s)", "e2e (s)", "queueing delay (s)"))
    for col, metric in enumerate(("ttft", "tpot", "e2e", "queue_delay"), start=1):
        x = np.sort(m[metric].dropna().to_numpy())
        if x.size > 2000:  # a CDF needs no more points than pixels
            x = x[np.linspace(0, x.size - 1, 2000).astype(int)]
        fig.add_trace(go.Scatter(x=x, y=np.linspace(0, 1, x.size), mode="lines", name=metric), row=1, col=col)
    fig.update_layout(title="Latency CDFs (measured requests)", showlegend=False, height=350)
    return fig


def tokens_per_pass(tokens: np.ndarray) -> go.Figure:
    total = tokens.sum(axis=0)
    nz = np.flatnonzero(total)
    fig = go.Figure(go.Bar(x=nz, y=total[nz]))
    fig.update_layout(title="Tokens per pass (all replicas)", xaxis_title="tokens in the pass",
                      yaxis_title="passes", height=350)
    return fig


def replica_load(replicas) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("requests", "busy share", "preemptions"))
    for col, metric in enumerate(("requests", "busy_share", "preemptions"), start=1):
        fig.add_trace(go.Bar(x=replicas["replica"], y=replicas[metric], name=metric), row=1, col=col)
    fig.update_layout(title="Per-replica load", showlegend=False, height=350)
    return fig


def kv_usage(kv, max_replicas: int = 16) -> go.Figure:
    fig = go.Figure()
    for replica, group in kv.groupby("replica"):
        if replica >= max_replicas:
            break
        fig.add_trace(go.Scatter(x=group["time"], y=group["kv_usage"], mode="lines", name=f"replica {replica}"))
    fig.update_layout(title="KV cache use over time", xaxis_title="time (s)", yaxis_title="share of blocks used",
                      height=350)
    return fig


def sweep_curve(sweep) -> go.Figure:
    g = sweep.groupby("rate").mean(numeric_only=True).reset_index()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("latency vs throughput", "SLA attainment"))
    for metric in ("ttft_p95", "tpot_p95", "e2e_p50"):
        fig.add_trace(go.Scatter(x=g["throughput_rps"], y=g[metric], mode="lines+markers", name=metric), 1, 1)
    fig.add_trace(go.Scatter(x=g["rate"], y=g["sla_share"], mode="lines+markers", name="SLA share"), 1, 2)
    fig.add_trace(go.Scatter(x=g["rate"], y=g["effective_throughput_rps"], mode="lines+markers",
                             name="effective throughput"), 1, 2)
    fig.update_xaxes(title_text="throughput (req/s)", row=1, col=1)
    fig.update_xaxes(title_text="arrival rate (req/s)", row=1, col=2)
    fig.update_layout(title="Load sweep", height=400)
    return fig


def write_report(path: str | Path, result, summary: dict, sweep=None, title: str = "splitfuse simulation") -> Path:
    """One self-contained HTML file (plotly.js embedded once)."""
    figures = [latency_cdfs(result.requests), tokens_per_pass(result.tokens_per_pass),
               replica_load(result.replicas), kv_usage(result.kv)]
    if sweep is not None:
        figures.insert(0, sweep_curve(sweep))
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{_fmt(v)}</td></tr>" for k, v in summary.items())
    parts = [f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>",
             f"<h1>{html.escape(title)}</h1><table>{rows}</table>"]
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(parts))
    return path


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))
