"""Simulator speed: wall time of the whole process and simulated requests per wall second.

(a) 1 replica, 10,000 requests; (b) 100 replicas, 1,000,000 requests. llama-2-7b profile, prompts ~N(2600, 10%)
capped at 4,000 as in FastGen's benchmark (a million draws reach 6 sigma), outputs ~N(128, 10%), Poisson arrivals
at 80% of the estimated capacity, Dynamic SplitFuse (budget 768), round-robin balancing. Each case runs in a fresh
process, timed from outside (imports included), with its peak RSS. With round-robin the replicas of (b) run in one
worker process per CPU (exactly the single-process results); the child also prints its own peak RSS and that of
its largest worker, so the peak of the whole tree is at most own + workers x largest. The summary is computed from
numpy columns; ``--frames`` also builds the result DataFrames (importing pandas), as a DataFrame user would.

    python benchmarks/sim_speed.py            # both cases
    python benchmarks/sim_speed.py --case a [--frames]
"""

from __future__ import annotations

import argparse
import resource
import sys

CASES = {"a": (1, 10_000), "b": (100, 1_000_000)}


def run_case(replicas: int, num_requests: int, frames: bool = False) -> None:
    from sim.capacity import estimate_capacity
    from sim.cluster import ClusterConfig, simulate
    from sim.costs import load_cost_model
    from sim.metrics import summarize
    from sim.workload import LengthDist, Workload

    cost = load_cost_model("llama-2-7b")
    workload = Workload(num_requests=num_requests, prompt=LengthDist("normal", (2600, 0.1)),
                        output=LengthDist("normal", (128, 0.1)), max_prompt_tokens=4000)
    workload.rate = 0.8 * estimate_capacity(cost, workload, replicas)
    result = simulate(workload, ClusterConfig(cost, replicas=replicas, balancer="round-robin"), seed=0)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=[*CASES, "both"], default="both")
    parser.add_argument("--frames", action="store_true", help="also build the result DataFrames (imports pandas)")
    parser.add_argument("--run", choices=list(CASES), help=argparse.SUPPRESS)  # the timed child process
    args = parser.parse_args()
    if args.run:
        run_case(*CASES[args.run], frames=args.frames)
        return
    import subprocess
    import time

    for case in CASES if args.case == "both" else [args.case]:
        replicas, n = CASES[case]
        start = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        command = [sys.executable, __file__, "--run", case] + (["--frames"] if args.frames else [])
        out = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode:
            sys.exit(out.stderr)
        cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
        print(f"({case}) {replicas} replica(s), {n:,} requests: wall {wall:.2f} s (cpu {cpu:.2f} s), "
              f"{n / wall:,.0f} simulated requests per wall second, peak RSS {usage.ru_maxrss / 2**20:.2f} GiB "
              "(largest single process)")
        print("    " + out.stdout.strip().replace("\n", "\n    "))


if __name__ == "__main__":
    main()
