"""Replica scaling study: 1, 2, 4 ... 1,024 replicas at proportional load, for every load balancer.

Each replica gets the same arrival rate: ``--load`` (default 80%) of one replica's estimated capacity
(``sim.saturation.estimate_capacity``), so N replicas get N times one replica's rate. The workload is FastGen's
long-prompt one (``splitfuse simulate``'s default: prompts ~N(2600, 30%) clipped at 4,000, outputs ~N(128, 30%),
Poisson arrivals), on the shipped llama-2-7b profile with Dynamic SplitFuse. One replica is the same run for every
balancer, so it runs once. Per cell: the completion rate (the inverse slope of the measured requests' finish times:
a steady-state rate, free of the run's drain), FastGen's effective throughput (completion rate x share meeting the
SLA at 4 tokens/s), TTFT and TPOT p50/p95, and the scaling ratio: effective throughput over N x one replica's (1.0
is linear; FastGen reports 16.2x at 16 replicas, i.e. 1.01). Scaling "stops being linear" at the first N whose ratio
falls below ``--linear`` (default 0.95).

Simulation time grows with the number of requests, so each run has ``--requests-per-replica`` x N requests, at least
``--min-requests`` and at most ``--max-requests`` (at 1,024 replicas about 60 per replica, ~10 s of simulated
time; the first 30% and the last 10% of the requests are left out of the statistics). Runs stay in one process
(``workers=1``).

    python -m benchmarks.scaling_study                 # the whole study (~15 min of one core), writes the results
    python -m benchmarks.scaling_study --quick         # 1-16 replicas, two balancers, few requests (a smoke run)

Prints a table; writes ``benchmarks/results/scaling_study.json`` (rows, settings, run metadata) and
``scaling_study.html`` / ``scaling_study.png`` (the PNG where kaleido finds a browser) beside it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.common import RESULTS_DIR, write_results
from sim.scaling import figure, linear_until, with_ratios

REPLICAS = tuple(2**k for k in range(11))  # 1 ... 1,024
SLA_RATE = 4.0  # tokens/s: FastGen's headline generation SLA (sim.metrics.SLA's default)


def run_cell(replicas: int, balancer: str, per_replica_rate: float, num_requests: int, args) -> dict:
    """One simulation: ``replicas`` behind ``balancer`` at ``replicas`` x ``per_replica_rate``."""
    from engine.policy import PolicyConfig
    from sim.cluster import ClusterConfig, simulate
    from sim.metrics import summarize
    from sim.workload import Workload

    config = ClusterConfig(args.profile, replicas=replicas, policy=PolicyConfig(balancer=balancer))
    workload = Workload(num_requests=num_requests, rate=replicas * per_replica_rate)
    start = time.process_time()
    result = simulate(workload, config, seed=args.seed, warmup=args.warmup, cooldown=args.cooldown, workers=1)
    cpu = time.process_time() - start
    s = summarize(result)
    rate = s["completion_rate_rps"]
    row = {"balancer": balancer, "replicas": replicas, "requests": num_requests, "offered_rps": workload.rate,
           "arrival_rate_rps": s["arrival_rate_rps"], "completion_rate_rps": rate, "sla_share": s["sla_share"],
           "effective_throughput_rps": rate * s["sla_share"],
           **{k: s[k] for k in ("ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95", "mean_busy_share", "preemptions")},
           "cpu_s": cpu}
    for key in ("energy_per_request_j", "fleet_power_w"):  # present where the profile has an energy section
        if key in s:
            row[key] = s[key]
    return row


def write_figure(fig, folder: Path, name: str) -> list[Path]:
    paths = [folder / f"{name}.html"]
    fig.write_html(paths[0], include_plotlyjs="cdn")
    try:
        fig.write_image(folder / f"{name}.png", scale=1.5)
        paths.append(folder / f"{name}.png")
    except Exception as e:  # no kaleido or no browser for it: the HTML stands alone
        print(f"no PNG ({type(e).__name__}: {e})")
    return paths


def print_table(rows: list[dict]) -> None:
    print(f"{'balancer':<15}{'N':>6}{'requests':>10}{'offered req/s':>14}{'done req/s':>11}{'x N*1':>7}"
          f"{'SLA %':>7}{'eff req/s':>10}{'eff x N*1':>10}{'TTFT p50 s':>11}{'TTFT p95 s':>11}{'TPOT p50 s':>11}"
          f"{'TPOT p95 s':>11}{'cpu s':>7}")
    for r in rows:
        print(f"{r['balancer']:<15}{r['replicas']:>6}{r['requests']:>10,}{r['offered_rps']:>14.1f}"
              f"{r['completion_rate_rps']:>11.1f}{r['throughput_ratio']:>7.3f}{100 * r['sla_share']:>7.1f}"
              f"{r['effective_throughput_rps']:>10.1f}{r['effective_ratio']:>10.3f}{r['ttft_p50']:>11.3f}"
              f"{r['ttft_p95']:>11.3f}{r['tpot_p50']:>11.4f}{r['tpot_p95']:>11.4f}{r['cpu_s']:>7.1f}")


def main() -> None:
    from engine.policy.load_balancer import BALANCERS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="llama-2-7b")
    ap.add_argument("--replicas", default=",".join(map(str, REPLICAS)), help="comma-separated replica counts")
    ap.add_argument("--balancers", default=",".join(BALANCERS), help="comma-separated balancer names")
    ap.add_argument("--load", type=float, default=0.8, help="share of one replica's estimated capacity, per replica")
    ap.add_argument("--requests-per-replica", type=int, default=200)
    ap.add_argument("--min-requests", type=int, default=3000)
    ap.add_argument("--max-requests", type=int, default=60_000)
    ap.add_argument("--warmup", type=float, default=0.3, help="share of the requests left out at the start "
                    "(the runs at 1,024 replicas are ~10 s of simulated time, ~3 of them filling the replicas)")
    ap.add_argument("--cooldown", type=float, default=0.1)
    ap.add_argument("--linear", type=float, default=0.95, help="the ratio below which scaling is not linear")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1-16 replicas, round-robin and least-requests, 1,000 "
                    "requests at most (a smoke run; writes scaling_study_quick.*)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for scaling_study.json and the figure")
    ap.add_argument("--plot-only", action="store_true", help="only redraw the figure from --out's scaling_study.json")
    args = ap.parse_args()
    if args.plot_only:
        import json

        data = json.loads((args.out / "scaling_study.json").read_text())
        print_table(data["rows"])
        for p in write_figure(figure(data["rows"]), args.out, "scaling_study"):
            print(f"wrote {p}")
        return
    if args.quick:
        args.replicas, args.balancers = "1,2,4,8,16", "round-robin,least-requests"
        args.min_requests, args.max_requests, args.requests_per_replica = 400, 1000, 100
    replicas = sorted({int(n) for n in args.replicas.split(",")} | {1})
    balancers = args.balancers.split(",")
    unknown = [b for b in balancers if b not in BALANCERS]
    if unknown:
        ap.error(f"--balancers: unknown {unknown[0]!r}; choose from {', '.join(BALANCERS)}")

    from sim.cluster import ClusterConfig
    from sim.saturation import estimate_capacity
    from sim.workload import Workload

    per_replica_rate = args.load * estimate_capacity(ClusterConfig(args.profile, replicas=1), Workload())
    rows = []
    for n in replicas:
        requests = min(args.max_requests, max(args.min_requests, args.requests_per_replica * n))
        for balancer in balancers if n > 1 else balancers[:1]:
            row = run_cell(n, balancer, per_replica_rate, requests, args)
            if n == 1:
                row["balancer"] = "(one replica)"
            rows.append(row)
            print(f"{balancer:<15} N={n:<5} {requests:>7,} requests: effective {row['effective_throughput_rps']:.1f} "
                  f"req/s, TTFT p95 {row['ttft_p95']:.3f} s ({row['cpu_s']:.0f} s CPU)", flush=True)
    rows = with_ratios(rows)
    linear = linear_until(rows, args.linear)
    print_table(rows)
    for balancer, n in linear.items():
        print(f"{balancer}: effective throughput within {args.linear:.0%} of linear up to "
              f"{'no more than 1' if n is None else f'{n:,}'} replicas")
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    settings["per_replica_rate_rps"] = per_replica_rate
    args.out.mkdir(parents=True, exist_ok=True)
    name = "scaling_study_quick" if args.quick else "scaling_study"  # a smoke run keeps the study's files
    path = write_results(args.out / f"{name}.json", "scaling_study", rows, card="cpu (simulated)",
                         settings=settings, linear_until=linear)
    print(f"wrote {path}")
    for p in write_figure(figure(rows), args.out, name):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
