"""``report.html`` of ``splitfuse validate``: where the simulator is right and wrong, cell by cell and pass by pass.

Self-contained (plotly's JavaScript inlined once), so it renders offline. Panels: the simulator's relative error per
cell against the server's and the client's view (latencies; rates apart); measured against simulated latency CDFs
of the first cell; the profile's pass-level error by execution path; the serving path's delivery time (server pass
end to client receipt).
"""

from __future__ import annotations

from html import escape
from pathlib import Path

LATENCY_ERRORS = ("ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90", "e2e_mean", "e2e_p90", "itl_p90")
RATE_ERRORS = ("throughput_rps", "token_throughput_tps", "mean_tokens_per_pass")


def _cell_label(row) -> str:
    load = f"{row['load']:.0%} load" if row.get("load") == row.get("load") and row.get("load") is not None \
        else f"{row['clients']} clients"
    fleet = f", {row['replicas']} x {row['balancer']}" if row.get("replicas", 1) > 1 else ""
    return f"{row['scheduler']} {row['token_budget']}{fleet}, {row['mix']}, {load}"


def figures(frame, errors, passes, delivery) -> list:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figs = []
    errors = errors.assign(cell=[_cell_label(r) for _, r in errors.iterrows()])
    for group, title in ((LATENCY_ERRORS, "latencies"), (RATE_ERRORS, "throughput and pass size")):
        fig = make_subplots(rows=1, cols=2, subplot_titles=("against the server (pass ends)",
                                                            "against the client (tokens received)"),
                            shared_yaxes=True)
        for col, view in enumerate(("server", "client"), start=1):
            part = errors[errors.view == view]
            for metric in group:
                fig.add_trace(go.Bar(x=part["cell"], y=100 * part[metric], name=metric, legendgroup=metric,
                                     showlegend=col == 1), row=1, col=col)
        fig.update_yaxes(title_text="simulated - measured, % of measured", row=1, col=1)
        fig.update_layout(title=f"The simulator's error on {title}, per cell", barmode="group", height=480)
        figs.append(fig)
    if len(passes):
        fig = go.Figure()
        busy = passes.dropna(subset=["loop_s"])
        for path, part in busy.groupby("path"):
            rel = 100 * (part["predicted_s"] - part["loop_s"]) / part["loop_s"]
            fig.add_trace(go.Histogram(x=rel, name=f"{path} ({len(part)} passes)", opacity=0.6, nbinsx=80))
        fig.update_layout(title="The profile's error per pass: predicted - measured time from one step's start to "
                                "the next, % of measured (passes followed at once by the next)",
                          barmode="overlay", xaxis_title="error, %", yaxis_title="passes", height=420)
        figs.append(fig)
    if len(delivery):
        fig = go.Figure()
        for name, a, b in (("first token", "client_first_token", "server_first_token"),
                           ("last token", "client_finish", "server_finish")):
            ms = 1e3 * (delivery[a] - delivery[b]).sort_values()
            fig.add_trace(go.Scatter(x=ms, y=[(i + 1) / len(ms) for i in range(len(ms))], name=name, mode="lines"))
        fig.update_layout(title="Delivery: the client receives a token this long after the pass that made it ended",
                          xaxis_title="ms", yaxis_title="share of requests", height=420)
        figs.append(fig)
    return figs


def _table(frame) -> str:
    cols = ["scheduler", "token_budget", "replicas", "balancer", "mix", "load", "clients", "source", "throughput_rps",
            "ttft_mean", "tpot_mean", "e2e_mean", "e2e_p90"]
    cols = [c for c in cols if c in frame.columns]
    return frame[cols].to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="")


def write_report(path: Path, frame, errors, passes, delivery, meta: dict) -> Path:
    import plotly.io as pio

    parts = [f"<h1>Simulator against the real engine</h1><p>model {escape(str(meta.get('model')))}; profile "
             f"{escape(str(meta['profile'].get('model')))} on {escape(str(meta['profile'].get('card')))} "
             f"({escape(str(meta['profile'].get('kind')))}); measured {escape(str(meta.get('date')))}, commit "
             f"{escape(str(meta.get('commit') or '-'))}; saturation rates (req/s) "
             f"{escape(str(meta.get('saturation_rps')))}. {escape(meta.get('note', ''))}"
             + (f" Left out of both sides: {escape(meta['excluded'])}." if meta.get("excluded") else "") + "</p>",
             "<h2>Every cell: means in seconds, throughput in requests/s</h2>", _table(frame)]
    for i, fig in enumerate(figures(frame, errors, passes, delivery)):
        parts.append(pio.to_html(fig, include_plotlyjs=i == 0, full_html=False))
    path.write_text("<html><head><meta charset='utf-8'><title>splitfuse validate</title></head><body>"
                    + "\n".join(parts) + "</body></html>")
    return path
