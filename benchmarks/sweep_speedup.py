"""Speed-up of a load sweep on N worker processes (or Ray) against one process, and whether the tables match.

The sweep: the llama-2-7b profile, one replica, FastGen's long-prompt workload, 8 rates from 0.2x to 1.2x the
estimated capacity x 4 seeds x 2,000 requests (32 independent runs). Timed in this process (imports excluded);
the load average before and after says how busy the machine was. Writes ``sweep_speedup_cpu.json``.

    python -m benchmarks.sweep_speedup                        # 1 process against one per CPU
    python -m benchmarks.sweep_speedup --processes 16 --ray   # also on a local Ray instance
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.common import write_results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--ray", action="store_true", help="Also run the sweep on a local Ray instance.")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import pandas as pd

    from sim.capacity import load_sweep
    from sim.cluster import ClusterConfig
    from sim.saturation import estimate_capacity
    from sim.workload import Workload

    config = ClusterConfig(replicas=1)
    workload = Workload(num_requests=args.requests)
    capacity = estimate_capacity(config, workload)
    rates = [capacity * (0.2 + i / 7) for i in range(8)]
    seeds = range(4)
    runs = {"1 process": {"processes": 1}, f"{args.processes} processes": {"processes": args.processes}}
    if args.ray:
        import ray

        ray.init(num_cpus=args.processes, include_dashboard=False, log_to_driver=False)
        runs[f"Ray, {args.processes} CPUs"] = {"backend": "ray"}
    rows, frames = [], {}
    for name, parallel in runs.items():
        load = os.getloadavg()[0]
        start = time.perf_counter()
        frames[name] = load_sweep(workload, config, rates, seeds, **parallel)
        wall = time.perf_counter() - start
        rows.append({"backend": name, "runs": len(frames[name]), "wall (s)": round(wall, 2),
                     "load average before": round(load, 2)})
    base = rows[0]["wall (s)"]
    first = next(iter(frames.values()))
    for row, frame in zip(rows, frames.values()):
        row["speed-up"] = round(base / row["wall (s)"], 2)
        row["same table"] = bool(frame.equals(first))
    print(pd.DataFrame(rows).to_string(index=False))
    path = write_results(args.out, "sweep_speedup", rows, card="cpu", cpus=os.cpu_count(), rates_rps=rates,
                         seeds=list(seeds), requests=args.requests)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
