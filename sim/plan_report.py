"""``plan.html``: a plan's ranked table and its figures (cost against rate, the pick's latency CDFs, SLA share
against load per replica), each axis with its unit."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from sim import report_figures as figures

COLORS = figures.COLORS


def cost_frontier(result, plan) -> go.Figure:
    """USD/h against the request rate: each candidate replica's step line (whole replicas at its sustainable
    rate), the checked fleets as points, the pick as a star."""
    fig = go.Figure()
    x = np.linspace(0, 1.5 * plan.target_rate, 300)
    for i, c in enumerate(result.capacities):
        if not c.rate:
            continue
        price = result.prices.loc[c.profile, "usd_per_gpu_hour"] * result.prices.loc[c.profile, "gpus_per_replica"]
        fig.add_trace(go.Scatter(x=x, y=np.ceil(x / c.rate) * price, mode="lines", line={"shape": "hv",
                                 "color": COLORS[i % len(COLORS)]},
                                 name=f"{result.prices.loc[c.profile, 'card']}, {c.scheduler} {c.token_budget}"))
    checked = [f for f in result.candidates if f.check is not None]
    fig.add_trace(go.Scatter(x=[plan.target_rate] * len(checked), y=[f.usd_per_hour for f in checked],
                             mode="markers", marker={"size": 9, "color": "gray"}, name="checked fleets",
                             text=[f"{f.name(result.prices)} ({f.balancer}): {f.check.verdict}" for f in checked]))
    if result.pick:
        fig.add_trace(go.Scatter(x=[plan.target_rate], y=[result.pick.usd_per_hour], mode="markers",
                                 marker={"size": 16, "symbol": "star", "color": "black"},
                                 name=f"pick: {result.pick.name(result.prices)}"))
    fig.update_layout(title="Cost of a fleet against the request rate it must sustain", height=figures.HEIGHT,
                      xaxis_title="request rate (req/s)", yaxis_title="cost (USD/h)")
    return fig


def sla_share_against_load(result, target: float) -> go.Figure:
    """Each candidate replica's search: the share meeting the SLA (%, 95% interval) against its rate (req/s)."""
    fig = go.Figure()
    for i, c in enumerate(result.capacities):
        frame = c.evaluations
        if frame is None or frame.empty:
            continue
        share = 100 * frame["share"].to_numpy()
        low = 100 * np.clip(frame["share_low"].to_numpy(), 0, 1)
        high = 100 * np.clip(frame["share_high"].to_numpy(), 0, 1)
        fig.add_trace(go.Scatter(x=frame["rate"], y=share, mode="lines+markers",
                                 error_y={"type": "data", "array": high - share, "arrayminus": share - low},
                                 marker={"color": COLORS[i % len(COLORS)]}, text=frame["verdict"],
                                 name=f"{result.prices.loc[c.profile, 'card']}, {c.scheduler} {c.token_budget}"))
    fig.add_hline(y=100 * target, line_dash="dash", annotation_text=f"target {target:.0%}")
    fig.update_layout(title="SLA share against load, one replica (the capacity search's rates; bars: 95% interval "
                            "over replications)", height=figures.HEIGHT,
                      xaxis_title="request rate per replica (req/s)", yaxis_title="requests meeting the SLA (%)")
    return fig


def write_plan_report(path: str | Path, result, plan, table, pick_results, config_rows: dict) -> Path:
    """``plan.html`` (plotly.js embedded: works offline)."""
    sections = [("Cost against rate", cost_frontier(result, plan)),
                ("SLA share against load", sla_share_against_load(result, config_rows.get("_target", 0.9)))]
    if pick_results:
        sections.insert(1, ("Latency of the pick", figures.latency_cdfs(pick_results)))
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                   for k, v in config_rows.items() if not k.startswith("_"))
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>splitfuse plan</title>",
             "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}</style>",
             "</head><body><h1>splitfuse plan</h1>", f"<table>{rows}</table>", "<h2>Candidates, cheapest first</h2>",
             table.to_html(border=0, na_rep="-", float_format=lambda v: "-" if math.isnan(v) else f"{v:g}")]
    for i, (heading, fig) in enumerate(sections):
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=i == 0, config={"displaylogo": False}))
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(parts))
    return path
