"""Simulator speed: wall time of the whole process and simulated requests per wall second.

(a) 1 replica, 10,000 requests; (b) 100 replicas, 1,000,000 requests. llama-2-7b profile, prompts ~N(2600, 10%)
capped at 4,000 as in FastGen's benchmark (a million draws reach 6 sigma), outputs ~N(128, 10%), Poisson arrivals
at 80% of the estimated capacity, Dynamic SplitFuse (budget 768), round-robin balancing. Each run is a fresh
process, timed from outside (imports included), with its peak RSS. With round-robin the replicas of (b) run in one
worker process per CPU (exactly the single-process results); the child also prints its own peak RSS and that of
its largest worker, so the peak of the whole tree is at most own + workers x largest. The summary is computed from
numpy columns; ``--frames`` also builds the result DataFrames (importing pandas), as a DataFrame user would.

``--baseline DIR`` times another checkout of the project (e.g. ``git worktree add /tmp/old <commit>``) with its own
``benchmarks/sim_speed.py`` in the same run, the two alternating round by round, so that both see the same
machine; the table gives each side's fastest and median round and their ratio. On a shared machine the fastest
round is the least disturbed one.

    python -m benchmarks.sim_speed                                # both cases, once each
    python -m benchmarks.sim_speed --case a --rounds 7 --baseline /tmp/old
    python -m benchmarks.sim_speed --out benchmarks/results/      # also writes sim_speed_<card>.json there
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {"a": (1, 10_000), "b": (100, 1_000_000)}
TARGETS_S = {"a": 2.0, "b": 300.0}  # the simulator's speed targets (issue: 10k requests <= 2 s; 1M <= 5 min)
HERE = Path(__file__).resolve()


def run_case(replicas: int, num_requests: int, frames: bool = False) -> None:
    from engine.policy import PolicyConfig
    from sim.cluster import ClusterConfig, simulate
    from sim.costs import load_cost_model
    from sim.metrics import summarize
    from sim.saturation import estimate_capacity
    from sim.workload import LengthDist, Workload

    cost = load_cost_model("llama-2-7b")
    workload = Workload(num_requests=num_requests, prompt=LengthDist("normal", (2600, 0.1)),
                        output=LengthDist("normal", (128, 0.1)), max_prompt_tokens=4000)
    config = ClusterConfig(cost, replicas=replicas, policy=PolicyConfig(balancer="round-robin"))
    workload.rate = 0.8 * estimate_capacity(config, workload)
    result = simulate(workload, config, seed=0)
    s = summarize(result)
    if frames:  # what a user of the DataFrames pays on top (pandas import and construction)
        print(f"frames: {len(result.requests)} requests, {len(result.replicas)} replicas, {len(result.kv)} KV points")
    passes = sum(r["passes"] for r in result.replica_rows)
    print(f"rate {workload.rate:.4g} req/s, throughput {s['throughput_rps']:.4g} req/s, passes "
          f"{passes}, ttft_p50 {s['ttft_p50']:.3g} s, itl_p95 {s['itl_p95']:.3g} s, "
          f"preemptions {s['preemptions']}, profile kind {cost.meta.get('kind')}")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"peak RSS: this process {own:.2f} GiB, largest worker process {workers:.2f} GiB")


def time_child(tree: Path, case: str, frames: bool) -> dict:
    """One run of ``tree``'s own sim_speed.py for ``case`` in a fresh process: wall and CPU seconds, peak RSS. The
    child runs the script by its path (its ``--run`` imports only the simulator), which works in any checkout,
    including old ones where ``benchmarks`` is not yet a package."""
    script = tree / "benchmarks" / "sim_speed.py"
    command = [sys.executable, str(script), "--run", case] + (["--frames"] if frames else [])
    env = {**os.environ, "PYTHONPATH": str(tree)}  # before the installed (editable) project
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, cwd=tree, env=env)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        sys.exit(f"{script} --run {case} failed:\n{out.stderr}")
    cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_gib": usage.ru_maxrss / 2**20, "stdout": out.stdout.strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=[*CASES, "both"], default="both")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side per case (alternating)")
    parser.add_argument("--baseline", type=Path, help="another checkout to time in the same run")
    parser.add_argument("--frames", action="store_true", help="also build the result DataFrames (imports pandas)")
    parser.add_argument("--out", type=Path, help="write the results as JSON: this file, or sim_speed_<card>.json "
                        "in this existing folder")
    parser.add_argument("--run", choices=list(CASES), help=argparse.SUPPRESS)  # the timed child process
    args = parser.parse_args()
    if args.run:
        run_case(*CASES[args.run], frames=args.frames)
        return
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    sides = {"this": HERE.parent.parent}
    if args.baseline is not None:
        if not (args.baseline / "benchmarks" / "sim_speed.py").is_file():
            parser.error(f"--baseline {args.baseline}: no benchmarks/sim_speed.py there")
        sides = {"baseline": args.baseline.resolve(), **sides}
    rows = []
    for case in CASES if args.case == "both" else [args.case]:
        replicas, n = CASES[case]
        runs = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, tree in sides.items():
                runs[side].append(time_child(tree, case, args.frames))
        for side, results in runs.items():
            walls = [r["wall_s"] for r in results]
            rows.append({"case": case, "replicas": replicas, "requests": n, "side": side, "tree": str(sides[side]),
                         "rounds": len(walls), "min_wall_s": min(walls), "median_wall_s": statistics.median(walls),
                         "min_cpu_s": min(r["cpu_s"] for r in results),
                         "peak_rss_gib": max(r["peak_rss_gib"] for r in results), "target_s": TARGETS_S[case],
                         "requests_per_s": n / min(walls), "child": results[0]["stdout"]})
    print(f"{'case':<5}{'side':<10}{'rounds':>7}{'min wall s':>12}{'median s':>10}{'min cpu s':>11}{'RSS GiB':>9}"
          f"{'req/s':>10}{'target s':>10}")
    for r in rows:
        print(f"{r['case']:<5}{r['side']:<10}{r['rounds']:>7}{r['min_wall_s']:>12.2f}{r['median_wall_s']:>10.2f}"
              f"{r['min_cpu_s']:>11.2f}{r['peak_rss_gib']:>9.2f}{r['requests_per_s']:>10,.0f}{r['target_s']:>10.0f}")
    if args.baseline is not None:
        for case in dict.fromkeys(r["case"] for r in rows):
            old, new = (next(r for r in rows if r["case"] == case and r["side"] == s) for s in ("baseline", "this"))
            print(f"({case}) this / baseline: fastest round {new['min_wall_s'] / old['min_wall_s']:.3f}, "
                  f"median {new['median_wall_s'] / old['median_wall_s']:.3f}")
    for r in rows:
        print(f"    ({r['case']}, {r['side']}) " + r["child"].replace("\n", "\n    "))
    if args.out:
        from benchmarks.common import write_results

        write_results(args.out, "sim_speed", rows)


if __name__ == "__main__":
    main()
