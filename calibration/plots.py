"""A profile's figures (plotly): its measured points with the fitted model over them.

- ``latency`` and ``throughput`` against tokens per pass: points by sweep (held-out ones open, decode points
  coloured by their context), model curves for one prompt and for decodes at several contexts. Throughput against
  tokens per pass is the curve DeepSpeed-FastGen uses to argue for a fixed token budget: it rises while passes are
  bound by reading the weights and flattens once they are compute-bound.
- ``context``: a decode step against its context, one model curve per batch size.
- ``accuracy``: predicted against measured time, and the relative error against tokens per pass.

``write_plots`` writes one self-contained HTML file (plotly.js embedded: it renders offline) and a PNG per figure
through kaleido, which drives a Chrome or Chromium.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from calibration.plans import PassSpec
from calibration.profile import point_features
from engine.policy import PassFeatures, plan_features

SWEEP_COLORS = {"prefill": "#1f77b4", "decode": "#d62728", "mixed": "#2ca02c", "eager-mixed": "#9467bd"}
CONTEXTS = (128, 512, 2048, 8192)  # decode model curves
DECODE_BATCHES = (1, 16, 64, 256)
MAX_LOG2_BATCH = 9  # the decode colour bar runs from batch 1 to 512
PNG_HELP = ("PNG export drives a Chrome or Chromium through kaleido: install one (Debian: apt-get install chromium; "
            "or run plotly_get_chrome) and make sure kaleido is installed (pip install 'splitfuse[plots]'); the HTML "
            "file has every figure")


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick values 1-2-5 per decade covering [lo, hi], labelled plainly (``"500"``, ``"2k"``), for a log axis."""
    values = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
              for m in (1, 2, 5)]
    values = [v for v in values if lo / 1.5 <= v <= hi * 1.5]
    return values, [_tick_text(v) for v in values]


def _tick_text(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def log_axis(values, title: str) -> dict:
    """A plotly log axis over ``values`` with ``log_ticks``."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    ticks, text = log_ticks(values.min(), values.max())
    return {"title": title, "type": "log", "tickvals": ticks, "ticktext": text}


def _context_color(context: float) -> str:
    """A red whose darkness grows with log context (128 -> light, 8192 -> dark)."""
    import plotly.colors

    share = float(np.clip((np.log2(max(context, 1)) - 7) / 6, 0, 1))
    return plotly.colors.sample_colorscale("Reds", [0.35 + 0.65 * share])[0]


def _decode_pass(batch: int, context: int) -> PassFeatures:
    return plan_features(PassSpec("decode", decode_contexts=(context,) * int(batch)))


def _curves(profile) -> dict[str, tuple[np.ndarray, np.ndarray, str]]:
    """Model curves along T: one prompt from scratch, and decodes at each of ``CONTEXTS`` the cache can hold."""
    top = profile.max_model_len - 1
    t = np.unique(np.geomspace(1, 8192, 200).astype(int))
    predict = profile.model.predict
    prefill = [predict(plan_features(PassSpec("prefill", chunks=tuple((0, c, 0) for c in _split(n, top))))) for n in t]
    curves = {"model: one prompt": (t, np.array(prefill), SWEEP_COLORS["prefill"])}
    for ctx in (c for c in CONTEXTS if c < top):
        cap = profile.num_kv_blocks * profile.block_size // (ctx + 1)
        td = t[t <= min(512, cap)]
        curves[f"model: decodes at {ctx:,} context"] = (
            td, np.array([predict(_decode_pass(b, ctx)) for b in td]), _context_color(ctx))
    return curves


def _split(n: int, per: int) -> list[int]:
    return [per] * (n // per) + ([n % per] if n % per else [])


def _title(profile) -> str:
    m = profile.meta
    return f"{m.get('model')} on {m.get('card')} ({m.get('dtype')}, {m.get('kind')})"


def _point_groups(profile):
    """(name, mask, colour, symbol) for the points: prefill and mixed by split; decodes by split and context."""
    pts = profile.points
    sweep = np.array([p.get("sweep") for p in pts])
    split = np.array([p.get("split", "train") for p in pts])
    context = np.array([p["decode_context"] / max(p["num_seqs"], 1) for p in pts])
    nearest = 2.0 ** np.round(np.log2(np.maximum(context, 1)))
    for kind in ("prefill", "mixed", "eager-mixed", "decode"):
        for part, symbol in (("train", "circle"), ("heldout", "diamond-open")):
            mask = (sweep == kind) & (split == part)
            if kind != "decode":
                if mask.any():
                    yield f"{kind} ({part})", mask, SWEEP_COLORS[kind], symbol
                continue
            for ctx in np.unique(nearest[mask]):
                yield (f"decode at ~{int(ctx):,} context ({part})", mask & (nearest == ctx), _context_color(ctx),
                       symbol)


def figures(profile) -> dict:
    """{"latency", "throughput", "context", "accuracy"} -> plotly figure."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    title = _title(profile)
    pts = profile.points
    T = np.array([p["num_tokens"] for p in pts], dtype=float)
    y = np.array([p[profile.fit.get("target", "wall_s")] for p in pts], dtype=float)
    pred = np.array([profile.model.predict(point_features(p)) for p in pts])
    curves = _curves(profile)
    figs = {}
    for name, f, unit in (("latency", lambda t, s: s * 1e3, "time per pass (ms)"),
                          ("throughput", lambda t, s: t / s, "throughput (tokens/s)")):
        fig = go.Figure()
        for label, mask, color, symbol in _point_groups(profile):
            fig.add_trace(go.Scatter(x=T[mask], y=f(T[mask], y[mask]), mode="markers", name=label,
                                     marker={"color": color, "symbol": symbol, "size": 6}))
        if len(pts):
            fig.add_trace(go.Scatter(x=T, y=f(T, pred), mode="markers", name="model at each point",
                                     marker={"color": "black", "symbol": "x-thin-open", "size": 5}))
        for label, (t, s, color) in curves.items():
            fig.add_trace(go.Scatter(x=t, y=f(t, s), mode="lines", name=label, line={"width": 2, "color": color}))
        all_t = np.concatenate([T, *(t for t, _, _ in curves.values())])
        all_y = np.concatenate([f(T, y), *(f(t, s) for t, s, _ in curves.values())])
        fig.update_layout(title=f"{name.capitalize()} vs tokens per pass: {title}", template="plotly_white",
                          xaxis=log_axis(all_t, "tokens per pass (tokens)"),
                          yaxis=log_axis(all_y, unit) if name == "latency" else {"title": unit})
        figs[name] = fig
    figs["context"] = _context_figure(profile, title)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Predicted against measured (ms)",
                                                        "Relative error against tokens per pass (%)"))
    split = np.array([p.get("split", "train") for p in pts])
    for part, symbol, color in (("train", "circle", "#636efa"), ("heldout", "diamond-open", "#ef553b")):
        mask = split == part
        marker = {"symbol": symbol, "size": 6, "color": color}
        fig.add_trace(go.Scatter(x=y[mask] * 1e3, y=pred[mask] * 1e3, mode="markers", name=f"{part} points",
                                 marker=marker, legendgroup=part), row=1, col=1)
        fig.add_trace(go.Scatter(x=T[mask], y=100 * (pred[mask] / y[mask] - 1), mode="markers", showlegend=False,
                                 name=f"{part} points", marker=marker, legendgroup=part), row=1, col=2)
    if len(pts):
        ms = np.array([y.min(), y.max()]) * 1e3
        for factor, dash, label in ((1.0, "solid", "predicted = measured"), (1.08, "dot", "+8%"), (0.92, "dot", "-8%")):
            fig.add_trace(go.Scatter(x=ms, y=ms * factor, mode="lines", name=label,
                                     line={"color": "gray", "dash": dash}), row=1, col=1)
        fig.update_xaxes(**log_axis(y * 1e3, "measured (ms)"), row=1, col=1)
        fig.update_yaxes(**log_axis(pred * 1e3, "predicted (ms)"), row=1, col=1)
        fig.update_xaxes(**log_axis(T, "tokens per pass (tokens)"), row=1, col=2)
    fig.update_yaxes(title_text="(predicted - measured) / measured (%)", row=1, col=2)
    fig.update_layout(title=f"Model accuracy: {title}", template="plotly_white")
    figs["accuracy"] = fig
    return figs


def _context_figure(profile, title: str):
    """A decode step's time against the context of its sequences: measured decode points and one model curve per
    batch size."""
    import plotly.graph_objects as go

    fig = go.Figure()
    top = profile.max_model_len - 1
    contexts = np.unique(np.geomspace(16, top, 60).astype(int))
    capacity = profile.num_kv_blocks * profile.block_size
    for batch in DECODE_BATCHES:
        ctx = contexts[contexts * batch <= capacity]
        if ctx.size:
            fig.add_trace(go.Scatter(x=ctx, y=[profile.model.predict(_decode_pass(batch, c)) * 1e3 for c in ctx],
                                     mode="lines", name=f"model: batch {batch}", line={"color": _batch_color(batch)}))
    decode = [p for p in profile.points if p.get("sweep") == "decode"]
    if decode:
        batch = np.array([p["num_seqs"] for p in decode])
        fig.add_trace(go.Scatter(
            x=[p["decode_context"] / p["num_seqs"] for p in decode],
            y=[p[profile.fit.get("target", "wall_s")] * 1e3 for p in decode], mode="markers",
            name="measured decode steps (colour: batch)",
            marker={"color": np.log2(batch), "colorscale": "Viridis", "cmin": 0, "cmax": MAX_LOG2_BATCH, "size": 7,
                    "showscale": True, "colorbar": {"title": "batch (sequences)", "x": 1.02,
                                                    "tickvals": list(range(MAX_LOG2_BATCH + 1)),
                                                    "ticktext": [str(2 ** k) for k in range(MAX_LOG2_BATCH + 1)]}}))
    fig.update_layout(title=f"Decode step vs context: {title}", template="plotly_white",
                      legend={"orientation": "h", "y": -0.2},
                      xaxis=log_axis(contexts, "context per sequence (tokens)"),
                      yaxis={"title": "time per pass (ms)"})
    return fig


def _batch_color(batch: int) -> str:
    """The colour of ``batch`` on the decode points' colour bar (Viridis over log2 batch 0..MAX_LOG2_BATCH)."""
    import plotly.colors

    return plotly.colors.sample_colorscale("Viridis", [min(math.log2(batch) / MAX_LOG2_BATCH, 1.0)])[0]


def write_plots(profile, out_dir: str | Path, png: bool = True) -> list[Path]:
    """One self-contained HTML file with every figure, and a PNG per figure when kaleido can render here; when it
    cannot, one message on stderr says why and what to install."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{profile.meta.get('model')}-{_slug(profile.meta.get('card', ''))}-{profile.meta.get('dtype')}"
    figs = figures(profile)
    html = out_dir / f"{stem}.html"
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figs.values())]
    html.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_title(profile)}</title></head>"
                    f"<body>{''.join(parts)}</body></html>")
    written = [html]
    for name, fig in figs.items() if png else ():
        path = out_dir / f"{stem}-{name}.png"
        try:
            fig.write_image(path, width=1100, height=650)
        except Exception as e:  # kaleido missing, or no Chrome for it to drive: report it whole, once
            reason = " ".join(str(e).split())
            print(f"no PNG written: {type(e).__name__}: {reason}\n{PNG_HELP}", file=sys.stderr)
            break
        written.append(path)
    return written


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-")
