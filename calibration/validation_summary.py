"""The tables and plots of ``calibration/VALIDATION.md``, from the measured grids in ``calibration/validation/``.

    python -m calibration.validation_summary [--plots DIR]

prints, per grid, the simulator's relative error (%) against the client and the server for the headline metrics,
and FastGen's headline from each ``*fastgen`` grid; with ``--plots`` writes PNGs of the same (plotly, kaleido).

    python -m calibration.validation_summary --variants GRID [--variants GRID ...]

prints instead how the given grids read under each pricing shipped beside them (``GRID-own-host``,
``GRID-typical-host``, ...): the table of a round that judges several prices on the same runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from calibration.validation_results import compare, read_validation, with_bounds

HEADLINE = ("throughput_rps", "ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90", "e2e_mean", "e2e_p90")
SHORT = {"throughput_rps": "req/s", "ttft_mean": "TTFT", "ttft_p90": "TTFT p90", "tpot_mean": "TPOT",
         "tpot_p90": "TPOT p90", "e2e_mean": "e2e", "e2e_p90": "e2e p90"}


def error_table(results, grid: str, reference: str = "client"):
    """Rows: the grid's cells; columns: the headline metrics; values: (sim - measured) / measured in %."""
    errors = compare(results[results.grid == grid], reference)
    errors = errors[errors.metric.isin(HEADLINE)]
    table = errors.pivot_table(index="cell", columns="metric", values="rel_error", sort=False) * 100
    return table[[m for m in HEADLINE if m in table.columns]].rename(columns=SHORT)


def variant_table(results, grids, reference: str = "client"):
    """How the runs of ``grids`` read under each pricing shipped beside them: a grid ``G`` as priced as shipped, and
    ``G-<variant>`` (e.g. ``G-typical-host``) the same runs priced otherwise. One row per variant ("shipped" for
    ``G`` itself), over every grid's cells: cells within every bound, mean |TPOT| and |TTFT| (%), and TPOT's range
    (%): the variants every grid has. ValueError naming a grid that is missing or lacks the ``reference`` view."""
    import pandas as pd

    names = set(results.grid)
    missing = [grid for grid in grids if grid not in names]
    if missing:
        raise ValueError(f"no grid named {', '.join(missing)} in the validation results")
    variants = {grid: {name[len(grid):].lstrip("-") or "shipped" for name in names
                       if name == grid or name.startswith(grid + "-")} for grid in grids}
    shared = sorted(set.intersection(*variants.values()), key=lambda v: (v != "shipped", v))
    rows = []
    for variant in shared:
        chosen = [grid if variant == "shipped" else f"{grid}-{variant}" for grid in grids]
        errors = compare(results[results.grid.isin(chosen)], reference)
        if errors.empty:
            raise ValueError(f"the grids {', '.join(chosen)} have no {reference} view to judge")
        judged = [c for c in ("load", "replicas") if c in errors.columns]  # what picks a cell's bounds
        cells = errors.pivot_table(index=["grid", "cell"], columns="metric", values="rel_error", sort=False)
        cells = with_bounds(cells.join(errors.groupby(["grid", "cell"])[judged].first()).reset_index())
        tpot, ttft = cells.tpot_mean * 100, cells.ttft_mean * 100
        rows.append({"pricing": variant, "cells in every bound": f"{cells.in_bounds.sum()} of {len(cells)}",
                     "mean |TPOT| %": tpot.abs().mean(), "TPOT %": f"{tpot.min():+.1f}..{tpot.max():+.1f}",
                     "mean |TTFT| %": ttft.abs().mean()})
    return pd.DataFrame(rows)


def fastgen_headline(results, grid: str = "h200-llama-2-7b-fastgen"):
    """Per source: each scheduler's best effective throughput over the client counts (req/s meeting FastGen's
    SLA), their ratio, and prefill-first's p95 inter-token latency over splitfuse's at each client count."""
    import pandas as pd

    rows = []
    for source, part in results[results.grid == grid].groupby("source", sort=False):
        best = part.groupby("scheduler").effective_throughput_rps.max()
        itl = part.pivot(index="clients", columns="scheduler", values="itl_p95")
        ratios = (itl["prefill-first"] / itl["splitfuse"]).round(2)
        rows.append({"source": source, "splitfuse req/s": best["splitfuse"],
                     "prefill-first req/s": best["prefill-first"],
                     "effective throughput ratio": best["splitfuse"] / best["prefill-first"],
                     **{f"p95 ITL ratio @{c}": r for c, r in ratios.items()}})
    return pd.DataFrame(rows)


def error_figure(results, grid: str):
    """The client-side error of TTFT, TPOT and e2e means per cell, with the issue's bounds shaded."""
    import plotly.graph_objects as go

    table = error_table(results, grid)
    fig = go.Figure()
    for metric in ("TTFT", "TPOT", "e2e", "req/s"):
        fig.add_trace(go.Bar(x=table.index, y=table[metric], name=metric))
    fig.add_hrect(y0=-5, y1=5, fillcolor="green", opacity=0.08, line_width=0)
    fig.update_layout(title=f"{grid}: simulated - measured (client), % of measured; band: +-5%", barmode="group",
                      yaxis_title="error, %", height=460, width=1100, margin={"b": 170})
    return fig


def fastgen_figure(results, grid: str = "h200-llama-2-7b-fastgen"):
    """Throughput against p95 inter-token latency and mean TTFT, per scheduler, measured (client) and simulated."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("p95 inter-token latency", "mean TTFT"))
    part = results[(results.grid == grid) & results.source.isin(["client", "sim"])]
    colors = dict(zip(sorted(part.scheduler.unique()), ("#636EFA", "#EF553B", "#00CC96")))
    for (scheduler, source), g in part.groupby(["scheduler", "source"]):
        g = g.sort_values("clients")
        style = {"color": colors[scheduler], **({"dash": "dot"} if source == "sim" else {})}
        for col, metric in ((1, "itl_p95"), (2, "ttft_mean")):
            fig.add_trace(go.Scatter(x=g.throughput_rps, y=1e3 * g[metric], mode="lines+markers", line=style,
                                     name=f"{scheduler} ({'simulated' if source == 'sim' else 'measured'})",
                                     text=[f"{c} clients" for c in g.clients], showlegend=col == 1,
                                     legendgroup=f"{scheduler}{source}"), row=1, col=col)
    fig.update_xaxes(title_text="throughput, requests/s")
    fig.update_yaxes(title_text="ms", type="log")
    fig.update_layout(title=f"{grid}: closed loop, 1-32 clients", height=460, width=1100)
    return fig


@click.command()
@click.option("--plots", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write one PNG per grid and the FastGen curves here.")
@click.option("--variants", "variant_grids", multiple=True, metavar="GRID",
              help="Print only how these grids read under each pricing shipped beside them (GRID-own-host, ...), "
                   "client and server; repeat for several grids.")
def main(plots: Path | None, variant_grids: tuple[str, ...]) -> None:
    results = read_validation()
    results = results[results.kind == "measured"]
    if variant_grids:
        for reference in ("client", "server"):
            try:
                table = variant_table(results, list(variant_grids), reference)
            except ValueError as e:
                if reference == "server" and "no server view" in str(e):
                    continue  # grids from before the server's pass trace
                raise click.UsageError(str(e)) from None
            click.echo(f"\n### {len(variant_grids)} grids by pricing: against the {reference}\n")
            click.echo(table.to_markdown(index=False, floatfmt=".2f"))
        return
    for grid in results.grid.unique():
        for reference in ("client", "server"):
            if not (results[results.grid == grid].source == reference).any():
                continue
            click.echo(f"\n### {grid}: against the {reference} (%)\n")
            click.echo(error_table(results, grid, reference).to_markdown(floatfmt="+.1f"))
    fastgen = [grid for grid in results.grid.unique() if grid.endswith("fastgen")]
    for grid in fastgen:
        click.echo(f"\n### FastGen's headline: {grid}\n")
        click.echo(fastgen_headline(results, grid).to_markdown(index=False, floatfmt=".3g"))
    if plots:
        plots.mkdir(parents=True, exist_ok=True)
        for grid in results.grid.unique():
            error_figure(results, grid).write_image(plots / f"{grid}.png")
        for grid in fastgen:
            fastgen_figure(results, grid).write_image(plots / f"{grid}-curves.png")
        click.echo(f"wrote {plots}")


if __name__ == "__main__":
    main()
