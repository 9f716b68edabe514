"""`splitfuse plan` at a large target: its wall time on this machine, and its pick re-simulated independently.

Runs ``splitfuse plan --rate RATE --out DIR`` as a fresh process timed from outside (imports included), then
re-simulates the pick at the target rate with seeds neither the plan's searches nor its checks used, at twice the
check's run length, every request counted (warm-up included), and asks whether the share meeting the SLA still
reaches the target. Prints a table and writes ``plan_speed_cpu.json`` (host, commit, date) to ``--out``.

    python -m benchmarks.plan_speed                       # 1,000 req/s on the default llama-2-7b profiles
    python -m benchmarks.plan_speed --rate 200 --plan-args "--fit-resamples 5"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, run_metadata, write_results

RESIM_SEEDS = range(50_000, 50_003)


def resimulate(pick: dict, rate: float, target: float) -> dict:
    """The pick at ``rate`` with new seeds, twice the check's run length, every request counted, on the hosts it
    was planned for."""
    import dataclasses

    import numpy as np

    from sim.capacity import rerun
    from sim.metrics import SLA
    from sim.plan import Fleet
    from sim.workload import Workload

    fleet = Fleet(pick["counts"], pick["scheduler"], pick["token_budget"], pick["balancer"], pick["usd_per_hour"],
                  pick["replicas"], pick["replicas"], host_factors=pick.get("host_factors", {}))
    workload = dataclasses.replace(Workload(), rate=rate, num_requests=2 * pick["check_requests"])
    summaries = rerun(workload, fleet.cluster(), RESIM_SEEDS, SLA())
    shares = [s["sla_share"] for s in summaries]
    return {"requests": workload.num_requests, "seeds": list(RESIM_SEEDS), "sla_share_runs": shares,
            "sla_share_mean": float(np.mean(shares)), "meets_target": bool(np.mean(shares) >= target),
            "throughput_rps": float(np.mean([s["throughput_rps"] for s in summaries]))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--plan-args", default="", help="More options for splitfuse plan.")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="plan_speed_"))
    command = [sys.executable, "-c", "from splitfuse.cli import main; main()", "plan", "--rate", str(args.rate),
               "--out", str(folder), *shlex.split(args.plan_args)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    load_before = os.getloadavg()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    print(done.stdout[-4000:])
    if done.returncode:
        sys.exit(done.stderr)
    plan = json.loads((folder / "plan.json").read_text())
    pick = plan["pick"]
    check = resimulate(pick, args.rate, 0.9)
    rows = [{"target (req/s)": args.rate, "plan wall (s)": round(wall, 1), "under 10 min": wall < 600,
             "pick": plan["answer"], "re-simulated share (%)": round(100 * check["sla_share_mean"], 2),
             "re-simulation meets": check["meets_target"]}]
    for key, value in rows[0].items():
        print(f"{key:28s}{value}")
    meta = run_metadata()
    path = write_results(args.out, "plan_speed", rows, card="cpu", plan=plan, resimulation=check,
                         command="splitfuse " + " ".join(command[3:]), load_average_before=load_before,
                         load_average_after=os.getloadavg(), host=meta["host"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
