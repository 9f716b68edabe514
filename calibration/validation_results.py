"""Sim-against-engine validation results: the long CSV format of ``calibration/validation/*.csv`` (one file per
grid, one row per source x cell: the ``validation.csv`` that ``splitfuse validate`` writes; see
``calibration/validation/README.md``), read and checked, and the simulator's relative error against each measured
source per cell and metric.
"""

from __future__ import annotations

from pathlib import Path

VALIDATION_DIR = Path(__file__).parent / "validation"
SOURCES = ("sim", "sim-server", "server", "client")  # the simulator; its server view; the engine's; the client's
VIEWS = {"server": "sim-server", "client": "sim"}  # a measured view -> the simulator's source that predicts it
# What makes a cell, as ``splitfuse validate`` writes it; a file has scheduler and mix, and load (open loop, a share
# of the saturation rate) or clients (closed loop), and may have the others.
CELL = ("scheduler", "token_budget", "mix", "arrivals", "load", "clients", "num_requests", "seed", "replicas",
        "balancer", "repeat", "max_concurrency", "temperature")
REQUIRED = ("source", "scheduler", "mix")
LATENCY_METRICS = tuple(f"{m}_{s}" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p95",
                                                                                      "p99"))
METRICS = (*LATENCY_METRICS, "throughput_rps", "token_throughput_tps", "mean_tokens_per_pass", "preemptions",
           "effective_throughput_rps", "sla_share")

# The bounds the simulator is judged by (issue 17, calibration/VALIDATION.md): |sim - measured| / measured per cell
# up to saturation; past it (load > 1) every one of these within OVERLOAD_BOUND; a fleet's cells on FLEET_BOUNDS.
BOUNDS = {"tpot_mean": 0.03, "e2e_mean": 0.03, "ttft_mean": 0.05, "tpot_p90": 0.10, "ttft_p90": 0.10,
          "e2e_p90": 0.10, "throughput_rps": 0.02}
OVERLOAD_BOUND = 0.10
FLEET_BOUNDS = {"throughput_rps": 0.02, "tpot_mean": 0.03, "ttft_mean": 0.05}


def bound_misses(row) -> list[str]:
    """The metrics of one cell's relative errors (a row with ``load``, ``replicas`` and metric columns, as
    ``splitfuse validate`` writes ``errors.csv``) outside their bound, in ``BOUNDS`` order; a metric the row lacks
    or could not measure (NaN) is not judged."""
    import math

    bounds = FLEET_BOUNDS if (row.get("replicas") or 1) > 1 else BOUNDS
    load = row.get("load")
    if load is not None and load > 1:
        bounds = dict.fromkeys(bounds, OVERLOAD_BOUND)
    return [metric for metric, bound in bounds.items()
            if row.get(metric) is not None and not math.isnan(row[metric]) and abs(row[metric]) > bound]


def with_bounds(errors):
    """``errors`` (one row per cell and view) with ``in_bounds`` and ``misses`` (the metrics outside their bound,
    ``bound_misses``, joined by spaces)."""
    misses = [" ".join(bound_misses(row)) for _, row in errors.iterrows()]
    return errors.assign(in_bounds=[not m for m in misses], misses=misses)


def read_validation(paths=None):
    """Every row of the given CSV files (default: ``calibration/validation/*.csv``) as one DataFrame, with
    ``grid`` (the file's stem unless the file has the column), ``kind`` ('measured' unless the file says) and
    ``line`` (the row's line in its file). ValueError naming the file and line of anything malformed."""
    import pandas as pd

    paths = sorted(VALIDATION_DIR.glob("*.csv")) if paths is None else [Path(p) for p in paths]
    frames = [_read_one(path) for path in paths]
    if not frames:
        return pd.DataFrame(columns=[*REQUIRED, "grid", "kind", "line"])
    return pd.concat(frames, ignore_index=True)


def _read_one(path: Path):
    import pandas as pd

    df = pd.read_csv(path, skip_blank_lines=False).dropna(how="all")
    df.insert(0, "line", df.index + 2)  # the header is line 1; blank lines keep their numbers
    missing = [c for c in REQUIRED if c not in df.columns] + ([] if {"load", "clients"} & set(df.columns)
                                                              else ["load (or clients)"])
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; a validation file needs "
                         f"{', '.join(REQUIRED)}, load or clients, and metric columns such as "
                         f"{', '.join(METRICS[:3])}")
    metrics = [c for c in METRICS if c in df.columns]
    if not metrics:
        raise ValueError(f"{path}: no metric columns; expected some of {', '.join(METRICS)}")
    for _, row in df.iterrows():
        if row["source"] not in SOURCES:
            raise ValueError(f"{path} line {row['line']}: source {row['source']!r} is not one of {', '.join(SOURCES)}")
    for column in (*metrics, *(c for c in ("load", "clients", "token_budget") if c in df.columns)):
        values = pd.to_numeric(df[column], errors="coerce")
        bad = df[values.isna() & df[column].notna() | (values < 0)]
        if len(bad):
            row = bad.iloc[0]
            raise ValueError(f"{path} line {row['line']}: {column} = {row[column]!r} is not a number >= 0")
        df[column] = values
    keys = [c for c in CELL if c in df.columns]
    duplicated = df[df.duplicated(["source", *keys], keep="first")]
    if len(duplicated):
        row = duplicated.iloc[0]
        raise ValueError(f"{path} line {row['line']}: a second {row['source']} row for the cell "
                         + ", ".join(f"{c}={row[c]}" for c in keys))
    if "grid" not in df.columns:
        df["grid"] = path.stem
    if "kind" not in df.columns:
        df["kind"] = "measured"
    return df


def compare(results, reference: str = "server"):
    """One row per (grid, cell, metric) where both the simulator and ``reference`` have a value: the cell's keys,
    ``cell`` (a short name of it), ``metric``, ``sim``, ``measured`` and ``rel_error`` = (sim - measured) / measured
    (NaN where measured is 0)."""
    import numpy as np
    import pandas as pd

    if reference not in VIEWS:
        raise ValueError(f"reference must be server or client, got {reference!r}")
    keys = ["grid", "kind", *(c for c in CELL if c in results.columns)]
    metrics = [m for m in METRICS if m in results.columns]
    cell = results[keys].apply(lambda col: col.map(str)).agg(" | ".join, axis=1)  # NaN keys (a closed-loop load) match
    long = results.assign(_cell=cell).melt(id_vars=[*keys, "source", "_cell"], value_vars=metrics,
                                           var_name="metric").dropna(subset=["value"])
    sim = long[long.source == VIEWS[reference]]
    if VIEWS[reference] != "sim":  # grids from before the simulator wrote its server view: its client view
        sim = pd.concat([sim, long[(long.source == "sim") & ~long["_cell"].isin(sim["_cell"])]])
    sim = sim.drop(columns="source").rename(columns={"value": "sim"})
    measured = long[long.source == reference][["_cell", "metric", "value"]].rename(columns={"value": "measured"})
    out = sim.merge(measured, on=["_cell", "metric"])
    m = out["measured"].to_numpy(dtype=float)
    out["rel_error"] = np.where(m > 0, out["sim"].to_numpy(dtype=float) / np.where(m > 0, m, 1) - 1, np.nan)
    names = [cell_name(row) for _, row in out.iterrows()]
    # cells of one grid that differ by their token budget, workload seed or repeat alone: named by it
    for key, label in (("token_budget", "budget {:g}"), ("seed", "seed {:g}"), ("repeat", "repeat {:g}")):
        if key in out.columns:
            shared = out.assign(_name=names).groupby(["grid", "_name"])[key].transform("nunique") > 1
            names = [f"{name} / {label.format(value)}" if several else name
                     for name, value, several in zip(names, out[key], shared)]
    out.insert(len(keys), "cell", names)
    return out.drop(columns="_cell")


def cell_name(row) -> str:
    """``splitfuse / long / load 0.5``, ``... / 8 clients``, ``... / load 0.9 / max concurrency 16``, ``... /
    temperature 0`` (any but the default 1.0), or a fleet's ``splitfuse x2 round-robin / ...``."""
    import pandas as pd

    load = row.get("load")
    what = f"load {load:g}" if load is not None and not pd.isna(load) else f"{int(row.get('clients', 0))} clients"
    cap = row.get("max_concurrency")
    what += f" / max concurrency {int(cap)}" if cap is not None and not pd.isna(cap) and cap > 0 else ""
    temperature = row.get("temperature")
    what += f" / temperature {temperature:g}" if temperature is not None and not pd.isna(temperature) \
        and temperature != 1.0 else ""
    replicas = row.get("replicas")
    fleet = f" x{int(replicas)} {row.get('balancer')}" if replicas is not None and not pd.isna(replicas) \
        and replicas > 1 else ""
    return f"{row['scheduler']}{fleet} / {row['mix']} / {what}"
