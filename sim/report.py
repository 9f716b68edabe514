"""``report.html``: what ran (the run configuration), the summary with units and confidence intervals over all
replications, and the figures of ``sim.report_figures``.

The full report embeds plotly.js once and renders offline; the light one loads plotly.js from its CDN (blank
without a network) and draws fewer points.
"""

from __future__ import annotations

import html
from pathlib import Path

from sim import report_figures as figures
from sim.metrics import SLA, few_replications_warning, summarize, summary_table
from sim.run_config import run_config

STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1500px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 10px;text-align:left}
th{background:#f3f3f3}h2{margin-top:1.6em}.note{color:#555;max-width:70em}"""


def write_report(path: str | Path, results, sla: SLA | None = None, sweep=None, light: bool = False,
                 config: dict | None = None, title: str = "splitfuse simulation") -> Path:
    """One HTML file for the replications ``results`` (``SimResult``s of one configuration, one per seed), with the
    load ``sweep`` (``sim.capacity.load_sweep``'s frame) when there is one. ``config``: the run-configuration rows
    (default: ``run_config`` of the results)."""
    sla = sla or SLA()
    first = results[0]
    meta = first.meta
    if config is None:
        config = run_config(first.config, meta.get("workload"), [r.seed for r in results], sla,
                            meta.get("warmup", 0.0), meta.get("cooldown", 0.0))
    summaries = [summarize(r, sla) for r in results]
    points = 60 if light else 200
    sections = []
    if sweep is not None:
        sections.append(("Load sweep", "Each curve is the mean over seeds at each swept rate; the shaded band is its "
                         "95% confidence interval.", figures.sweep_curves(sweep)))
    sections += [
        ("Latency", "Quantiles of each latency averaged over replications; the band is their 95% confidence "
         "interval.", figures.latency_cdfs(results, points)),
        ("SLA attainment", "FastGen's effective throughput is throughput x the share of requests that meet both the "
         "prompt and the generation SLA.", figures.sla_attainment(summaries)),
        ("Per-replica load", "Bars: mean over replications; whiskers: 95% confidence interval.",
         figures.replica_load(results)),
        ("Tokens per pass", "How full the passes were: the token budget caps them.",
         figures.tokens_per_pass(results)),
        ("KV cache", "Share of each replica's KV blocks in use.",
         figures.kv_usage(first, points=300 if light else 2000)),
    ]
    n = len(results)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             "<h2>Run configuration</h2>", _table(config.items(), ("setting", "value")),
             f"<h2>Summary</h2><p class='note'>Measured requests of {n} replication{'s' if n > 1 else ''}"
             + (": mean and 95% percentile-bootstrap confidence interval over them."
                + (f" {few_replications_warning(n)}." if few_replications_warning(n) else "") if n > 1 else
                " (one replication: no confidence interval; run --replications 5 for one).") + "</p>",
             summary_table(summaries).to_html(border=0)]
    for i, (heading, note, fig) in enumerate(sections):
        parts.append(f"<h2>{html.escape(heading)}</h2><p class='note'>{html.escape(note)}</p>")
        js = ("cdn" if light else True) if i == 0 else False
        parts.append(fig.to_html(full_html=False, include_plotlyjs=js, config={"displaylogo": False}))
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(parts))
    return path


def _table(rows, header) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
