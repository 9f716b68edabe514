"""Latency and throughput vs tokens per pass: the measured points with the fitted model over them (plotly).

Throughput vs tokens per pass is the curve DeepSpeed-FastGen uses to argue for a fixed token budget: it rises
while passes are bound by reading the weights and flattens once they are compute-bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibration.plans import PassSpec
from engine.policy import PassFeatures, plan_features

SWEEP_COLORS = {"prefill": "#1f77b4", "decode": "#d62728", "mixed": "#2ca02c"}


def _curves(profile) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Model curves along T: one prompt from scratch, and decodes at 1k context (where the cache holds them)."""
    top = profile.max_model_len - 1
    t = np.unique(np.geomspace(1, 8192, 200).astype(int))
    prefill = [profile.predict(plan_features(PassSpec("prefill", chunks=tuple((0, c, 0) for c in _split(n, top)))))
               for n in t]
    ctx = min(1024, top - 1)
    cap = profile.num_kv_blocks * profile.block_size // (ctx + 1)
    td = t[t <= min(512, cap)]
    decode = [profile.predict(plan_features(PassSpec("decode", decode_contexts=(ctx,) * int(b)))) for b in td]
    return {"model: one prompt": (t, np.array(prefill)), f"model: decodes at {ctx} context": (td, np.array(decode))}


def _split(n: int, per: int) -> list[int]:
    return [per] * (n // per) + ([n % per] if n % per else [])


def figures(profile):
    import plotly.graph_objects as go

    m = profile.meta
    title = f"{m.get('model')} on {m.get('card')} ({m.get('dtype')}, {m.get('kind')})"
    pts = profile.points
    T = np.array([p["num_tokens"] for p in pts], dtype=float)
    y = np.array([p[profile.fit.get("target", "wall_s")] for p in pts], dtype=float)
    pred = np.array([profile.predict(PassFeatures.from_mapping(p)) for p in pts])
    curves = _curves(profile)
    figs = {}
    for name, f, unit in (("latency", lambda t, s: s * 1e3, "ms per pass"),
                          ("throughput", lambda t, s: t / s, "tokens per second")):
        fig = go.Figure()
        for sweep, color in SWEEP_COLORS.items():
            for split, symbol in (("train", "circle"), ("heldout", "diamond-open")):
                mask = np.array([p.get("sweep") == sweep and p.get("split", "train") == split for p in pts])
                if mask.any():
                    fig.add_trace(go.Scatter(x=T[mask], y=f(T[mask], y[mask]), mode="markers",
                                             name=f"{sweep} ({split})", marker={"color": color, "symbol": symbol,
                                                                                 "size": 6}))
        if len(pts):
            fig.add_trace(go.Scatter(x=T, y=f(T, pred), mode="markers", name="model at each point",
                                     marker={"color": "black", "symbol": "x-thin-open", "size": 5}))
        for label, (t, s) in curves.items():
            fig.add_trace(go.Scatter(x=t, y=f(t, s), mode="lines", name=label, line={"width": 2}))
        fig.update_layout(title=f"{name.capitalize()} vs tokens per pass: {title}", template="plotly_white",
                          xaxis={"title": "tokens per pass", "type": "log"},
                          yaxis={"title": unit, "type": "log" if name == "latency" else "linear"})
        figs[name] = fig
    return figs


def write_plots(profile, out_dir: str | Path, png: bool = True) -> list[Path]:
    """HTML for each figure, and PNG through kaleido when it can render here (it needs a Chrome)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{profile.meta.get('model')}-{_slug(profile.meta.get('card', ''))}-{profile.meta.get('dtype')}"
    written = []
    for name, fig in figures(profile).items():
        html = out_dir / f"{stem}-{name}.html"
        fig.write_html(html, include_plotlyjs="cdn")
        written.append(html)
        if png:
            path = out_dir / f"{stem}-{name}.png"
            try:
                fig.write_image(path, width=1100, height=650)
                written.append(path)
            except Exception as e:  # kaleido missing, or no Chrome for it to drive
                print(f"no PNG for {name}: {type(e).__name__}: {str(e).strip().splitlines()[0][:160]}")
                png = False
    return written


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-")
