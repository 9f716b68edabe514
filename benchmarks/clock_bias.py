"""How far the card's clock moves the simulator's error: the power cap's bias per cell of a ``validate`` run.

``python -m benchmarks.clock_bias RUN_DIR CLOCKS PROFILE`` on the CPU. ``RUN_DIR``: a ``splitfuse validate --out``
directory with its pass traces; ``CLOCKS`` (.csv or .csv.gz): the card's clock sampled beside that run on its host,
a first line ``anchor <time.time()> <time.perf_counter()>`` then the lines of
``nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
--format=csv,noheader,nounits -lms 200``; ``PROFILE``: the profile the cells were compared with.

Each traced pass that sampled is matched to the clock sample nearest its middle (within 120 ms). Per path, the
median of served / predicted step time at a lowered SM clock (below ``--full-mhz``, default 99% of the highest
sample) over that at full clock is the path's slowdown. A serving section's scale per path is fitted on the
warm-up and overload runs, so it carries their share of pass time at a lowered clock; a cell whose share differs is
off by (cell's share - calibration runs' share) x the path's slowdown, weighted by the path's share of the cell's
pass time: the bias column (positive: the engine ran slower than the fit's clock, the simulator is optimistic by
about that much). Prints a table; writes ``clock_bias.csv`` into ``RUN_DIR``'s parent unless ``--out``.
"""

from __future__ import annotations

import datetime
import gzip
from pathlib import Path

import click
import numpy as np
import pandas as pd

from calibration.profile import load_profile
from engine.policy import PassFeatures
from sim.validate import load_measured

PATHS = ("decode-graph", "mixed-graph", "eager")
MATCH_S = 0.12  # a pass takes the clock sample nearest its middle, if one is this close


def read_clocks(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(times on the run's perf_counter clock, SM MHz) of an nvidia-smi log with its anchor line."""
    text = (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)).read().splitlines()
    head = text[0].split() if text else []
    if len(head) != 3 or head[0] != "anchor":
        raise ValueError(f"{path}: the first line must be 'anchor <time.time()> <time.perf_counter()>'")
    offset = float(head[2]) - float(head[1])
    times, mhz = [], []
    for line in text[1:]:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[2].isdigit():
            continue  # nvidia-smi's own messages
        stamp = datetime.datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
        times.append(stamp.timestamp() + offset)
        mhz.append(int(fields[2]))
    if not times:
        raise ValueError(f"{path}: no clock samples")
    return np.array(times), np.array(mhz)


def pass_clocks(directory: Path, clocks: Path, profile) -> tuple[pd.DataFrame, list]:
    """(one row per traced pass that sampled and met a clock sample: start, path, duration, served / predicted,
    SM MHz; the measured runs as ``load_measured`` gives them, every role)."""
    times, mhz = read_clocks(clocks)
    _, cells, traces = load_measured(directory, "cell")
    _, calibration, _ = load_measured(directory, "calibration")
    rows = []
    for server, trace in traces.items():
        if trace is None:
            raise ValueError(f"{directory}: server {server} wrote no pass trace")
        for replica in trace[0]:
            for p in replica:
                if p["num_samples"] == 0 or p["path"] not in PATHS:
                    continue
                mid = (p["start"] + p["updated"]) / 2
                i = int(np.argmin(np.abs(times - mid)))
                if abs(times[i] - mid) > MATCH_S:
                    continue
                served = p["updated"] - p["start"]
                rows.append({"server": server, "start": p["start"], "path": p["path"], "served_s": served,
                             "ratio": served / profile.model.predict(PassFeatures.from_mapping(p)),
                             "sm_mhz": int(mhz[i])})
    if not rows:
        raise ValueError(f"{directory}: no traced pass falls within {MATCH_S} s of a clock sample in {clocks}")
    return pd.DataFrame(rows), [("calibration", m) for _, m, _ in calibration] + [("cell", m) for _, m, _ in cells]


def clock_bias(directory: Path, clocks: Path, profile, full_mhz: float | None = None
               ) -> tuple[dict[str, float], pd.DataFrame]:
    """({path: slowdown at a lowered clock}, one row per cell: its share of pass time per path, the share of that
    at a lowered clock, and the bias in %)."""
    passes, runs = pass_clocks(directory, clocks, profile)
    full_mhz = full_mhz or 0.99 * passes.sm_mhz.max()
    passes["lowered"] = passes.sm_mhz < full_mhz
    slowdown = {}
    for path in PATHS:
        on = passes[passes.path == path]
        low, full = on.ratio[on.lowered], on.ratio[~on.lowered]
        slowdown[path] = float(low.median() / full.median() - 1) if len(low) >= 20 and len(full) >= 20 else 0.0

    def window(m) -> pd.DataFrame:
        return passes[(passes.start >= m.window[0]) & (passes.start <= m.window[1])]

    def lowered_share(frame: pd.DataFrame, path: str) -> float:
        on = frame[frame.path == path]
        return float(on.served_s[on.lowered].sum() / on.served_s.sum()) if len(on) else 0.0

    calib = pd.concat([window(m) for role, m in runs if role == "calibration"] or [passes.iloc[:0]])
    calib_share = {path: lowered_share(calib, path) for path in PATHS}
    out = []
    for role, m in runs:
        if role != "cell":
            continue
        frame = window(m)
        total = frame.served_s.sum()
        if total == 0:
            continue
        row = {"scheduler": m.cell.scheduler, "mix": m.cell.mix, "load": m.cell.load, "clients": m.cell.clients,
               "seed": m.cell.seed, "bias_%": 0.0}
        for path in PATHS:
            time_share = frame.served_s[frame.path == path].sum() / total
            share = lowered_share(frame, path)
            row[f"{path} time_%"] = 100 * time_share
            row[f"{path} lowered_%"] = 100 * share
            row["bias_%"] += 100 * time_share * (share - calib_share[path]) * slowdown[path]
        out.append(row)
    table = pd.DataFrame(out)
    for path in PATHS:
        table[f"calibration {path} lowered_%"] = 100 * calib_share[path]
    return slowdown, table


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("clocks", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("profile", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--full-mhz", type=float, default=None, help="SM clock from which a sample counts as full (MHz; "
              "default 99% of the highest sample).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="CSV to write.")
def main(directory: Path, clocks: Path, profile: Path, full_mhz: float | None, out: Path | None) -> None:
    try:
        slowdown, table = clock_bias(directory, clocks, load_profile(profile), full_mhz)
    except (ValueError, FileNotFoundError) as e:  # a bad clock log, profile or run directory: say which
        raise click.ClickException(str(e)) from None
    click.echo("slowdown at a lowered clock (served / predicted, median): " +
               ", ".join(f"{path} {100 * s:+.1f}%" for path, s in slowdown.items()))
    click.echo(table.round(2).to_string(index=False))
    out = out or directory.parent / "clock_bias.csv"
    table.to_csv(out, index=False)
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
