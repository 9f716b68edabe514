"""The replica scaling study's analysis (``benchmarks/scaling_study.py`` runs it, ``notebooks/05_scaling.ipynb``
reads its results): scaling ratios against N x one replica, where scaling stops being linear, and its figure."""

from __future__ import annotations


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with its throughput and effective throughput over N x those of one replica. Each run's rates are
    taken per request that arrived (over the fitted arrival rate of its measured requests), so that the sampling
    noise of the Poisson arrivals (a few % at a few thousand requests) does not enter the ratio: at proportional
    load, N x one replica's rate is what N replicas would do if they scaled linearly."""
    one = next(r for r in rows if r["replicas"] == 1)
    for r in rows:
        for name, key in (("throughput_ratio", "completion_rate_rps"), ("effective_ratio", "effective_throughput_rps")):
            r[name] = (r[key] / r["arrival_rate_rps"]) / (one[key] / one["arrival_rate_rps"])
    return rows


def linear_until(rows: list[dict], threshold: float) -> dict[str, int | None]:
    """Per balancer, the largest N before the first whose effective-throughput ratio falls below ``threshold``
    (None: it never stays linear past one replica)."""
    out = {}
    for balancer in dict.fromkeys(r["balancer"] for r in rows if r["replicas"] > 1):
        cells = sorted((r for r in rows if r["balancer"] == balancer or r["replicas"] == 1),
                       key=lambda r: r["replicas"])
        last = None
        for r in cells:
            if r["effective_ratio"] < threshold:
                break
            last = r["replicas"]
        out[balancer] = last
    return out


def figure(rows: list[dict]):
    """Effective-throughput ratio and TTFT p95 against replicas, one line per balancer."""
    import plotly.express as px
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("effective throughput / (N x one replica)",
                                                        "TTFT p95"))
    one = [r for r in rows if r["replicas"] == 1]
    balancers = list(dict.fromkeys(r["balancer"] for r in rows if r["replicas"] > 1))
    for balancer, color in zip(balancers, px.colors.qualitative.Plotly):
        cells = one + sorted((r for r in rows if r["balancer"] == balancer and r["replicas"] > 1),
                             key=lambda r: r["replicas"])
        x = [r["replicas"] for r in cells]
        style = {"name": balancer, "legendgroup": balancer, "mode": "lines+markers", "line": {"color": color}}
        fig.add_trace(go.Scatter(x=x, y=[r["effective_ratio"] for r in cells], **style), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[r["ttft_p95"] for r in cells], showlegend=False, **style), row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=1)
    for col, title in ((1, "scaling ratio (1 = linear)"), (2, "TTFT p95 (s, log)")):
        fig.update_xaxes(type="log", title_text="replicas", dtick=0.30103, row=1, col=col)
        fig.update_yaxes(title_text=title, row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(title="Replica scaling at proportional load (llama-2-7b, FastGen long prompts, SplitFuse)",
                      height=420, width=1000)
    return fig
