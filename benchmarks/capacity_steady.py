"""Does the capacity search's answer hold in steady state? The full-size check of `splitfuse simulate --sweep`.

The command's default cluster (4 replicas of the llama-2-7b profile, FastGen's long-prompt workload, SplitFuse at
budget 768, least-requests), the steady-state search (``sim.capacity.capacity_search``), then its answer and 10%
above it re-simulated at 10x the requests that decided the answer, with new seeds, every request counted (warm-up
included). Prints a table and writes ``capacity_steady_cpu.json`` (date, commit, host) to ``--out``.

    python -m benchmarks.capacity_steady                      # replications 5 (the search's default)
    python -m benchmarks.capacity_steady --replications 3 --check-seeds 3 --out benchmarks/results/
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks.common import write_results


def check(workload, config, sla, rate: float, requests: int, seeds, parallel: dict) -> dict:
    """The run-length check: ``rate`` at ``requests`` per replication over ``seeds``, all requests counted."""
    import numpy as np

    from sim.capacity import rerun

    summaries = rerun(dataclasses.replace(workload, rate=rate, num_requests=requests), config, seeds, sla, **parallel)
    shares = [s["sla_share"] for s in summaries]
    return {"rate_rps": rate, "requests": requests, "seeds": list(seeds), "sla_share_mean": float(np.mean(shares)),
            "sla_share_runs": shares, "throughput_rps": float(np.mean([s["throughput_rps"] for s in summaries])),
            "queue_delay_mean_s": float(np.mean([s["queue_delay_mean"] for s in summaries]))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=5)
    parser.add_argument("--check-seeds", type=int, default=3, help="New seeds for the 10x re-simulation.")
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import pandas as pd

    from sim.capacity import SearchConfig, capacity_search
    from sim.cluster import ClusterConfig
    from sim.metrics import SLA
    from sim.workload import Workload

    config, workload, sla = ClusterConfig(), Workload(), SLA()
    search = SearchConfig(replications=args.replications)
    parallel = {"processes": args.processes}
    start = time.perf_counter()
    answer = capacity_search(workload, config, sla, search,
                             on_evaluation=lambda e: print(f"  {e.rate:8.3f} req/s: {e.verdict:9s} "
                                                           f"{e.requests:,} requests", flush=True), **parallel)
    search_s = time.perf_counter() - start
    n = 10 * answer.requests
    seeds = range(10_000, 10_000 + args.check_seeds)  # none of the search's
    rows = []
    for label, rate in (("answer", answer.rate), ("answer x 1.1", 1.1 * answer.rate)):
        row = check(workload, config, sla, rate, n, seeds, parallel)
        row["meets_target"] = row["sla_share_mean"] >= search.target
        rows.append({"rate": label, **row})
        print(f"{label}: {row}", flush=True)
    table = pd.DataFrame(rows).set_index("rate")[["rate_rps", "requests", "sla_share_mean", "throughput_rps",
                                                  "queue_delay_mean_s", "meets_target"]]
    table.columns = ["rate (req/s)", "requests per run", "SLA share (mean)", "throughput (req/s)",
                     "queueing delay mean (s)", f"meets {search.target:.0%}"]
    print(f"search: {answer.rate:.4g} req/s meets, {answer.misses_at:.4g} req/s misses; decided at "
          f"{answer.requests:,} requests x {search.replications} replications; {len(answer.evaluations)} rates "
          f"judged in {search_s:.0f} s")
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
    path = write_results(args.out, "capacity_steady", rows, card="cpu", search_s=search_s,
                         answer_rps=answer.rate, misses_at_rps=answer.misses_at, decided_requests=answer.requests,
                         replications=search.replications, evaluations=answer.frame().to_dict(orient="records"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
