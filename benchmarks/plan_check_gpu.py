"""Does `splitfuse plan`'s answer hold on a real card? The plan's per-replica rate, served by the real engine.

`splitfuse plan` sizes a fleet from each replica's sustainable rate: the highest rate at which the simulator shows
the SLA met (a share of requests) in steady state, on a host as slow as the profile's margin for the workload's
mix (``sim.plan.replica_capacity``; ``calibration.host_spread``). This check runs that search, then serves its
rates on a real card:

1. ``plan`` (CPU): for each SLA, the search on the plan's host (``--host-margin`` as the plan takes it; default
   the profile's margin for the mix) and on the profile's own passes (a typical host): each answer
   (the highest rate shown to meet) and where it was shown to miss. Writes ``plan_rates.json``.
2. ``run MODEL`` (GPU): `splitfuse serve` with the policy, a closed-loop warm-up, then an open-loop Poisson run of
   ``--requests`` at each of those rates (or ``--rates``): the same seeded requests at every rate, their arrival
   times scaled by it (common random numbers: the rates differ by the rate alone, not by which requests came), each
   run with prompt tokens of its own (as `splitfuse validate`'s repeats: no prefix cache hit). Then ``compare``.
3. ``compare`` (CPU, also run by ``run``; ``--from DIR`` again): each measured run simulated on the same requests,
   on both hosts, and judged alike per SLA: the share of all requests that met it, and the growth of TTFT over the
   run (s per s of arrivals; a queue that grows shows there first). Prints a table, writes ``plan_check.csv`` and
   ``plan_check_<card>.json`` (card, versions, date) into the run's folder.

    python -m benchmarks.plan_check_gpu plan --profile llama-2-7b-h200-bf16 --out runs/pc/plan_rates.json
    python -m benchmarks.plan_check_gpu run llama-2-7b --rates-from runs/pc/plan_rates.json --requests 300 --out runs/pc
    python -m benchmarks.plan_check_gpu compare --from runs/pc

A run is finite and starts empty: a rate a little above what the card sustains still meets a loose SLA for a while,
with TTFT growing. The plan's search judges long steady runs, so the table shows both the share and the growth.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np

from benchmarks.common import number_list, run_metadata, write_results

# The SLAs checked by default: the plan's own (FastGen's, 90% of requests), and a latency goodput as `vllm bench
# serve --goodput` states one, which binds below saturation.
DEFAULT_SLAS = ("fastgen", "goodput=ttft:1000 tpot:25")
MEASURED = "measured.json.gz"  # what the run step served, for compare
GROWTH_LIMIT = 0.01  # s of TTFT per s of run: sim.capacity.SearchConfig.max_growth, the plan's bound on a queue


def parse_sla(spec: str):
    """``fastgen`` (FastGen's SLA, sim.metrics.SLA's defaults) or ``goodput=KEY:MS ...`` -> (name, SLA, share
    column)."""
    from sim.metrics import SLA, parse_goodput

    if spec == "fastgen":
        return spec, SLA(), "sla_share"
    kind, _, limits = spec.partition("=")
    if kind != "goodput" or not limits:
        raise ValueError(f"--sla {spec!r}: expected fastgen or goodput=KEY:MS ..., e.g. 'goodput=ttft:1000 tpot:25'")
    return spec, SLA(goodput=parse_goodput(limits)), "goodput_share"


def meets(columns, sla, column: str) -> np.ndarray:
    """Per request: whether it met ``sla`` (its FastGen SLA or its goodput limits, as ``column`` says)."""
    from sim.metrics import meets_fastgen_sla, meets_goodput

    return meets_goodput(columns, sla) if column == "goodput_share" else meets_fastgen_sla(
        columns, sla.generation_rate, sla)


# -- 1. the plan's rates -------------------------------------------------------------------------------------
def plan_rates(profile: str, scheduler: str, budget: int, mix: tuple[str, str, str], slas: list[str], target: float,
               host_margin: float | None, replications: int, max_requests: int, processes: int) -> dict:
    """Per SLA, the capacity search's answer on the plan's host and on a typical one (see the module docstring)."""
    from sim.capacity import SearchConfig
    from sim.plan import PlanConfig, replica_capacity
    from sim.workload import Workload, mix_name

    _, prompt, output = mix
    workload = Workload(prompt=prompt, output=output)  # prompts clipped as `splitfuse plan` clips them by default
    plan = PlanConfig(target_rate=1.0, profiles=(profile,), fit_resamples=0, host_margin=host_margin,
                      mix=mix_name(workload))
    typical = dataclasses.replace(plan, host_margin=0.0)
    out = {"profile": profile, "scheduler": scheduler, "token_budget": budget, "mix": list(mix), "target": target,
           "margin": plan.margin(profile, scheduler, budget), "replications": replications,
           "max_requests_per_replica": max_requests, "slas": {}}
    for spec in slas:
        _, sla, column = parse_sla(spec)
        search = SearchConfig(target=target, column=column, replications=replications,  # as `splitfuse plan`'s
                              max_requests_per_replica=max_requests,
                              requests_per_replica=min(SearchConfig.requests_per_replica, max_requests // 2))
        row = {}
        for host, config in (("plan", plan), ("typical", typical)):
            capacity = replica_capacity(profile, scheduler, budget, workload, sla, search, config,
                                        {"processes": processes})
            row[host], row[f"{host}_misses_at"] = capacity.rate, capacity.misses_at
        out["slas"][spec] = row
        print(f"{spec}: plan {row['plan']} req/s on hosts {out['margin']:.1%} slower (misses at "
              f"{row['plan_misses_at']}); typical host {row['typical']} (misses at {row['typical_misses_at']})")
    return out


SAME_RATE = 0.01  # answers this close (relative) are served as one rate, the lowest of them


def rates_to_run(plan: dict) -> list[float]:
    """Each SLA's answers and misses, on both hosts, in order, those within ``SAME_RATE`` of a lower one left out."""
    rates: list[float] = []
    for value in sorted(v for row in plan["slas"].values() for v in row.values() if v):
        if not rates or value > rates[-1] * (1 + SAME_RATE):
            rates.append(round(value, 3))
    return rates


# -- 2. the real card ----------------------------------------------------------------------------------------
def measure(model: str, plan: dict, rates: list[float], requests: int, seed: int, out: Path, engine_options: dict,
            processes: int, timeout: float) -> None:
    """Serve ``requests`` at each rate on a fresh `splitfuse serve`; write ``measured.json.gz`` (a device call
    returns files of at most 16 MiB: 9,600 short-mix requests' token times are 20 MiB as plain JSON)."""
    from sim.validate import Cell, Server, send_cell

    out.mkdir(parents=True, exist_ok=True)
    mix_name, prompt, output = plan["mix"]
    cell = Cell(plan["scheduler"], plan["token_budget"], mix_name, prompt, output, num_requests=requests, seed=seed)
    runs = []

    def keep(info: dict) -> None:  # after every run: a run cut short keeps what it served
        (out / MEASURED).write_bytes(gzip.compress(json.dumps({"plan": plan, "info": info, "runs": runs,
                                                               "meta": run_metadata()}).encode()))

    with Server(model, cell.policy, engine_options, None, out / "server.log") as server:
        print(f"server ready: {server.info['kv_total_blocks']} KV blocks, context {server.info['max_model_len']}")
        warm = dataclasses.replace(cell, num_requests=64, clients=16, seed=10_007)  # as validate's: kernels compile
        send_cell(server, warm, None, processes, timeout)
        for i, rate in enumerate(rates):
            run = dataclasses.replace(cell, repeat=i)
            measured = send_cell(server, run, rate, processes, timeout)
            runs.append({"cell": dataclasses.asdict(run), "rate": rate,
                         "records": [dataclasses.asdict(r) for r in measured.records]})
            keep(server.info)
            print(f"{rate:.3f} req/s: {run.num_requests} requests served")


# -- 3. the comparison ---------------------------------------------------------------------------------------
def judged(columns, sla, column: str) -> dict:
    """Share of all requests meeting the SLA, TTFT's growth over the run, completions over arrivals."""
    from sim.steady_state import queue_trend

    order = np.argsort(columns["arrival"], kind="stable")
    arrival, ttft = np.asarray(columns["arrival"])[order], np.asarray(columns["ttft"])[order]
    span = float(np.max(columns["finish"]) - np.min(columns["arrival"]))
    return {"share": float(meets(columns, sla, column).mean()), "ttft_growth": queue_trend(arrival, ttft),
            "throughput_rps": len(arrival) / span, "ttft_p90_s": float(np.percentile(ttft, 90)),
            "tpot_p90_s": float(np.nanpercentile(columns["tpot"], 90))}


def compare(directory: Path) -> list[dict]:
    from engine.policy import PolicyConfig
    from sim.bench import Record, to_result
    from sim.cluster import ClusterConfig, simulate
    from sim.plan import host_cost
    from sim.validate import Cell, ServedCost

    data = json.loads(gzip.decompress((directory / MEASURED).read_bytes()))
    plan, info = data["plan"], data["info"]
    hosts = {"typical": host_cost(plan["profile"]), "plan": host_cost(plan["profile"], 1 + plan["margin"])}
    rows = []
    for run in data["runs"]:
        cell = Cell(**run["cell"])
        policy = PolicyConfig(scheduler=cell.scheduler, token_budget=cell.token_budget)
        results = {"measured": to_result([Record(**r) for r in run["records"]], cell.seed).columns}
        for host, cost in hosts.items():
            served = ServedCost(cost, info["kv_total_blocks"], info["max_model_len"])
            results[f"sim, {host} host"] = simulate(cell.workload(run["rate"]), ClusterConfig(served, 1, policy),
                                                    seed=cell.seed, workload_seed=cell.seed).columns
        for spec, answers in plan["slas"].items():
            _, sla, column = parse_sla(spec)
            labels = [k.replace("_misses_at", " misses") for k, v in answers.items()
                      if v and abs(v - run["rate"]) <= SAME_RATE * run["rate"]]
            for source, columns in results.items():
                j = judged(columns, sla, column)
                rows.append({"sla": spec, "rate_rps": run["rate"], "plan_answer": ", ".join(labels),
                             "requests": len(columns["ttft"]), "source": source, **j,
                             "meets": j["share"] >= plan["target"] and j["ttft_growth"] <= GROWTH_LIMIT})
    return rows


def report(directory: Path) -> None:
    import pandas as pd

    rows = compare(directory)
    data = json.loads(gzip.decompress((directory / MEASURED).read_bytes()))
    frame = pd.DataFrame(rows)
    frame.to_csv(directory / "plan_check.csv", index=False)
    pd.set_option("display.width", 250)
    cell = frame.assign(cell=[f"{share:.1%} {growth:+.3f} {'meets' if ok else 'MISSES'}" for share, growth, ok in
                              zip(frame["share"], frame["ttft_growth"], frame["meets"])])
    table = cell.pivot_table(index=["sla", "rate_rps", "plan_answer"], columns="source", values="cell",
                             aggfunc="first", sort=False)
    tpot = (frame.pivot_table(index=["sla", "rate_rps", "plan_answer"], columns="source", values="tpot_p90_s",
                              sort=False) * 1e3).round(1)
    table["TPOT p90 ms (measured / sim, typical host)"] = [
        f"{m} / {s}" for m, s in zip(tpot["measured"], tpot["sim, typical host"])]
    print(f"{data['plan']['profile']} {data['plan']['scheduler']} {data['plan']['token_budget']}, mix "
          f"{data['plan']['mix'][0]}; target {data['plan']['target']:.0%} of requests; plan host "
          f"{data['plan']['margin']:.1%} slower than the profile; card {data['meta'].get('card')}")
    print("each source: share of all requests meeting the SLA, TTFT growth over the run (s/s), verdict")
    print(table.reset_index().to_string(index=False))
    card = data["meta"].get("card")  # the card that served the runs, wherever this comparison runs
    path = write_results(directory, "plan_check_gpu", {"plan": data["plan"], "rows": rows,
                                                       "measured_meta": data["meta"]}, card=card)
    print(f"wrote {directory / 'plan_check.csv'} and {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("plan", help="the capacity search's answers (CPU)")
    p.add_argument("--profile", default="llama-2-7b-h200-bf16")
    p.add_argument("--scheduler", default="splitfuse:768", help="NAME:TOKENS")
    p.add_argument("--mix", default="long", help="as splitfuse validate takes it: long, short or NAME=P/O")
    p.add_argument("--sla", action="append", help=f"fastgen or goodput=KEY:MS ... (repeat; default {DEFAULT_SLAS})")
    p.add_argument("--sla-target", type=float, default=0.9)
    p.add_argument("--host-margin", type=float, default=None,
                   help="default: the profile's margin for the mix")
    p.add_argument("--replications", type=int, default=5)
    p.add_argument("--max-requests-per-replica", type=int, default=4000)
    p.add_argument("--processes", type=int, default=None)
    p.add_argument("--out", type=Path, required=True, help="plan_rates.json to write")
    r = sub.add_parser("run", help="serve the plan's rates on this machine's GPU, then compare")
    r.add_argument("model")
    r.add_argument("--rates-from", type=Path, required=True, help="plan_rates.json of the plan step")
    r.add_argument("--rates", type=number_list(float), default=None,
                   help="req/s to serve instead of the plan's answers, e.g. 5.967,7.602")
    r.add_argument("--requests", type=int, default=300, help="served at each rate (the same ones)")
    r.add_argument("--seed", type=int, default=0, help="of the requests")
    r.add_argument("--client-processes", type=int, default=4)
    r.add_argument("--device", default=None)
    r.add_argument("--num-kv-blocks", type=int, default=None)
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare", help="compare a run again (CPU)")
    c.add_argument("--from", dest="directory", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.step == "plan":
        from sim.validate import parse_mix

        scheduler, _, budget = args.scheduler.partition(":")
        if not budget.isdigit():
            parser.error(f"--scheduler {args.scheduler!r}: expected NAME:TOKENS, e.g. splitfuse:768")
        plan = plan_rates(args.profile, scheduler, int(budget), parse_mix(args.mix), args.sla or list(DEFAULT_SLAS),
                          args.sla_target, args.host_margin, args.replications, args.max_requests_per_replica,
                          args.processes)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**plan, "meta": run_metadata()}, indent=1))
        print(f"wrote {args.out}: rates {rates_to_run(plan)}")
    elif args.step == "run":
        try:
            plan = json.loads(args.rates_from.read_text())
            rates = args.rates or rates_to_run(plan)
        except (OSError, ValueError, KeyError, TypeError) as e:
            parser.error(f"--rates-from {args.rates_from}: not a plan step's plan_rates.json ({e!r})")
        if not rates or min(rates) <= 0:
            parser.error(f"no positive rate to serve: {rates}")
        options = {k: v for k, v in (("device", args.device), ("num_kv_blocks", args.num_kv_blocks)) if v}
        measure(args.model, plan, rates, args.requests, args.seed, args.out, options,
                args.client_processes, timeout=600.0)
        report(args.out)
    else:
        if not (args.directory / MEASURED).is_file():
            parser.error(f"--from {args.directory}: no {MEASURED} there (the run step's --out)")
        report(args.directory)


if __name__ == "__main__":
    main()
