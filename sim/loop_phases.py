"""The engine loop between passes, phase by phase, from ``splitfuse validate`` runs' pass traces.

    python -m sim.loop_phases RUN [RUN...] [--profile P] [--path decode-graph] [--bins 16,32,64,96,128,192,256]

For each run (a ``validate --out`` folder, named by its folder), kind of run (warm-up, overload, cell) and bin of
sampled entries, the median loop after a sampled step of ``--path`` ("any": every path), from the scheduler's update
to the next step's start, and its phases: ``outputs`` (to the step's end: the pass's outputs built), ``send`` (to
when the loop had sent them to the API process) and ``rest`` (to the next start: commands, stats). A step is left out
where the engine took in a request between its start and the next (the loop then admits it too) or where the loop ran
over 20 ms (the engine went idle). With ``--profile``, the loop's price there (``ServingModel.loop_seconds``) beside it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from sim.validate import load_measured

MAX_LOOP_S = 0.02  # a longer gap after a step is the engine idle, not its loop
ADMISSION_LEAD_S = 0.01  # a request received this long before a step's start counts as taken in by its loop


def run_name(directory: Path) -> str:
    """A run's label: its folder's name ("." named as the folder it is)."""
    return directory.name or directory.resolve().name


def loop_rows(directory: Path) -> pd.DataFrame:
    """One row per sampled step of ``directory``'s runs whose loop took in no request: its run kind, path, sampled
    entries and loop phases (seconds)."""
    rows = []
    for role in ("calibration", "cell"):
        _, runs, traces = load_measured(directory, role)
        for name, m, _ in runs:
            trace = traces.get(name)
            if trace is None:
                continue
            passes, requests = trace
            received = np.sort([r["received"] for r in requests.values() if r.get("received") is not None])
            kind = "cell" if role == "cell" else ("warm-up" if m.cell.clients else "overload")
            first, last = m.window
            for engine in passes:
                for p, following in zip(engine, engine[1:]):
                    if not p.get("num_samples") or not first <= p["start"] <= last:
                        continue
                    after = following["start"]
                    since = p["start"] - ADMISSION_LEAD_S
                    taken_in = np.searchsorted(received, after) - np.searchsorted(received, since)
                    if after - p["updated"] > MAX_LOOP_S or taken_in:
                        continue
                    rows.append({"run": run_name(directory), "kind": kind, "path": p["path"],
                                 "num_samples": p["num_samples"], "loop_s": after - p["updated"],
                                 "outputs_s": p["end"] - p["updated"], "send_s": p["sent"] - p["end"],
                                 "rest_s": after - p["sent"]})
    return pd.DataFrame(rows, columns=["run", "kind", "path", "num_samples", "loop_s", "outputs_s", "send_s", "rest_s"])


def phase_table(rows: pd.DataFrame, bins: list[int], price=None) -> pd.DataFrame:
    """Per run, kind and bin of sampled entries (edges ``bins``, from 0): steps and the median of each phase (us);
    with ``price`` (sampled entries -> seconds), the loop's price at the bin's median entries and loop / price."""
    rows = rows.assign(entries=pd.cut(rows["num_samples"], [0, *bins]))
    grouped = rows.groupby(["run", "kind", "entries"], observed=True)
    table = grouped[["loop_s", "outputs_s", "send_s", "rest_s"]].median().mul(1e6).round(0)
    table.columns = ["loop_us", "outputs_us", "send_us", "rest_us"]
    table.insert(0, "steps", grouped.size())
    if price is not None:
        medians = grouped["num_samples"].median()
        table["price_us"] = [round(1e6 * price(int(n)), 0) for n in medians]
        table["loop_over_price"] = (table["loop_us"] / table["price_us"]).round(2)
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="splitfuse validate --out folders")
    parser.add_argument("--profile", help="a measured profile (name or file) whose loop price to show beside")
    parser.add_argument("--path", default="decode-graph",
                        help="the steps whose loops to show: decode-graph, mixed-graph, eager or any "
                             "(default %(default)s)")
    parser.add_argument("--bins", default="16,32,64,96,128,192,256",
                        help="upper edges of the bins of sampled entries (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        bins = sorted({int(b) for b in args.bins.split(",") if b})
    except ValueError:
        parser.error(f"--bins: whole numbers separated by commas, not {args.bins!r}")
    if not bins or bins[0] < 1:
        parser.error(f"--bins: edges of at least 1, not {args.bins!r}")
    missing = [str(run) for run in args.runs if not (run / "measured.jsonl").is_file()]
    if missing:
        parser.error(f"not a splitfuse validate --out folder (no measured.jsonl): {', '.join(missing)}")
    names = [run_name(run) for run in args.runs]
    if len(set(names)) < len(names):
        parser.error(f"runs shown together need folders of distinct names, got {', '.join(names)}")
    price = None
    if args.profile:
        from calibration.profile import load_profile

        try:
            serving = load_profile(args.profile).serving
        except ValueError as e:
            parser.error(f"--profile: {e}")
        if serving is None:
            parser.error(f"--profile {args.profile}: it has no serving section, so no loop price")
        price = serving.loop_seconds
    rows = pd.concat([loop_rows(run) for run in args.runs], ignore_index=True)
    if args.path != "any":
        rows = rows[rows["path"] == args.path]
    if rows.empty:
        parser.error(f"the runs hold no traced sampled step of the path {args.path!r}")
    with pd.option_context("display.width", 200, "display.max_rows", None):
        print(phase_table(rows, bins, price).to_string())


if __name__ == "__main__":
    main()
