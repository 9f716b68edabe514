"""``splitfuse simulate``: run the cluster simulator and print a summary (optionally a load sweep).

Every default is the Python API's (``Workload``, ``ClusterConfig``, ``PolicyConfig``, ``SLA``), read from there,
so ``simulate(Workload(), ClusterConfig())`` is the run this command makes without options.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from engine.policy import PolicyConfig, make_balancer, scheduler_class
from engine.policy.options import config_options, pick
from sim.capacity import SearchConfig
from sim.cluster import ClusterConfig
from sim.parallel_options import backend_options
from sim.router import SERVE_ROUTER
from sim.sla_options import SLA_CONTEXT, sla_options
from sim.workload import ARRIVALS, Workload, mix_name

REPORTS = ("full", "light", "none")
# Options that shape sampled workloads; a trace brings its own arrivals and lengths, so giving one is a mistake.
TRACE_IGNORES = ("rate", "load", "cv", "clients", "num_requests", "prompt_len", "output_len", "max_prompt_len")


@click.command(context_settings=SLA_CONTEXT)
@click.option("--profile", default=ClusterConfig.cost, show_default=True,
              help="Shipped profile name or profile JSON path (or builtin-llama-2-7b).")
@click.option("--replicas", default=ClusterConfig.replicas, show_default=True, type=int)
@config_options(PolicyConfig, exclude=("block_size",))  # the profile gives the block size the engine had
@click.option("--arrivals", default=None, help=f"{', '.join(ARRIVALS)} (default: trace with --trace, else poisson).")
@click.option("--rate", type=float, default=None, help="Arrival rate of the cluster, requests/s.")
@click.option("--load", type=float, default=Workload.load, show_default=True,
              help="Without --rate: this share of the estimated saturation rate.")
@click.option("--cv", type=float, default=Workload.cv, show_default=True,
              help="Gamma arrivals' coefficient of variation.")
@click.option("--clients", type=int, default=Workload.clients, help="Closed-loop clients (with --arrivals closed).")
@click.option("--max-concurrency", type=int, default=Workload.max_concurrency,
              help="Open loop: at most this many requests in flight; one due at the cap waits, and its latencies "
                   "start when it is sent (as vLLM's bench --max-concurrency).")
@click.option("--temperature", type=float, default=Workload.temperature, show_default=True,
              help="Every request's sampling temperature (0: greedy: the engine takes the argmax inside its graphs "
                   "and enqueues decode steps ahead, priced so where the profile measured greedy serving).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="CSV/JSONL trace to replay (its arrival times and lengths; Vidur's and vLLM's column names too).")
@click.option("--num-requests", "-n", default=Workload.num_requests, show_default=True, type=int)
@click.option("--prompt-len", default=str(Workload.prompt), show_default=True,
              help="fixed:N, uniform:LO:HI, normal:MEAN:REL, lognormal:MEAN:SIGMA or file:PATH:COLUMN.")
@click.option("--output-len", default=str(Workload.output), show_default=True, help="Same forms as --prompt-len.")
@click.option("--max-prompt-len", default=Workload.max_prompt_tokens, show_default=True, type=int,
              help="Clip sampled prompts to this many tokens (FastGen's benchmark uses 4000).")
@click.option("--noise/--no-noise", default=ClusterConfig.noise, show_default=True,
              help="Pass-time noise from the profile.")
@click.option("--serve-router/--no-serve-router", default=False, show_default=True,
              help="With --replicas > 1: each request and token also takes the hop of the router that "
                   "`splitfuse serve --replicas N` runs (sim.router.SERVE_ROUTER, measured; it grows with the "
                   "streams open, so the run stays in one process).")
@click.option("--host-typical", is_flag=True,
              help="Run every replica on the typical measured card of the profile for the workload's mix and "
                   "scheduler (the geometric mean of the overload runs its hosts section records, the runs "
                   "`splitfuse plan`'s margin reads) instead of the swept one.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--replications", default=1, show_default=True, type=int,
              help="Independent runs (seeds seed..seed+R-1); prints 95% confidence intervals.")
@click.option("--warmup", default=0.0, show_default=True, type=float, help="Share of first requests left out.")
@click.option("--cooldown", default=0.0, show_default=True, type=float, help="Share of last requests left out.")
@sla_options
@click.option("--rates", default=None, help="Load sweep over these comma-separated rates (requests/s).")
@click.option("--sweep", default=0, type=int, help="Load sweep over this many rates from 0.2x to 1.2x capacity.")
@click.option("--sla-target", default=SearchConfig.target, show_default=True, type=float,
              help="Share meeting the SLA that a sweep's best rate must reach.")
@click.option("--max-requests-per-replica", default=SearchConfig.max_requests_per_replica, show_default=True,
              type=int, help="Capacity search: the longest run it may grow to while undecided (requests per replica).")
@click.option("--max-queue-growth", default=SearchConfig.max_growth, show_default=True, type=float,
              help="Capacity search: the queueing-delay growth (s per s of run) a sustained rate may show.")
@backend_options
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Write requests.csv, summary.json and report.html here.")
@click.option("--report", type=click.Choice(REPORTS), default="full", show_default=True,
              help="report.html: full (self-contained, works offline), light (plotly.js from its CDN, fewer "
                   "points) or none.")
@click.option("--token-times", is_flag=True,
              help="With --out: also write every token's time to token_times.parquet (needs pyarrow).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@click.pass_context
def simulate(ctx: click.Context, **options):
    """Simulate a cluster of replicas on a calibrated profile.

    With no options: FastGen's long-prompt workload (prompts ~2,600, outputs ~128 tokens, 30% spread, clipped at
    4,000), Poisson at 80% of the estimated capacity of 4 replicas, Dynamic SplitFuse, on the llama-2-7b profile.
    """
    if options["trace"]:
        given = [name for name in TRACE_IGNORES
                 if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise click.UsageError(f"--trace replays the trace's own arrivals and lengths; drop {flags}")
    try:
        _run(**options)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _run(profile, replicas, arrivals, rate, load, cv, clients, max_concurrency, temperature, trace, num_requests,
         prompt_len, output_len, max_prompt_len, noise, serve_router, host_typical, seed, replications, warmup,
         cooldown, sla_gen_rate, sla_prompt_rate, cumulative_sla, goodput, rates, sweep, sla_target,
         max_requests_per_replica, max_queue_growth, backend, processes, ray_address, out, report, token_times,
         progress, **policy_options):
    options = {**locals(), **policy_options}
    del options["policy_options"]
    from calibration.host_spread import scheduler_name
    from sim.cluster import simulate
    from sim.costs import typical_host
    from sim.metrics import SLA, few_replications_warning, summarize, summary_table
    from sim.run_config import run_config
    from sim.saturation import estimate_capacity, with_rate

    if progress is None:
        progress = sys.stderr.isatty()
    policy = PolicyConfig(**pick(PolicyConfig, policy_options))
    scheduler_class(policy.scheduler), make_balancer(policy.balancer)  # fail fast on a bad name
    if replications < 1:
        raise ValueError(f"--replications must be >= 1, got {replications}")
    if rate is not None and not rate > 0:
        raise ValueError(f"--rate must be a positive number of requests per second, got {rate}")
    if token_times:
        if not out:
            raise ValueError("--token-times writes token_times.parquet into --out DIR; give --out")
        _require_parquet()
    workload = Workload(num_requests=num_requests, arrivals=arrivals, rate=rate, load=load, cv=cv, clients=clients,
                        max_concurrency=max_concurrency, temperature=temperature,
                        prompt=prompt_len, output=output_len, trace=trace, max_prompt_tokens=max_prompt_len)
    config = ClusterConfig(profile, replicas=replicas, policy=policy, noise=noise,
                           router=SERVE_ROUTER if serve_router else None)
    if host_typical:
        config = dataclasses.replace(config, cost=typical_host(
            config.cost, mix_name(workload), scheduler_name(policy.scheduler, policy.max_num_batched_tokens)))
    cost = config.costs()[0]
    sla = SLA(prompt_tokens_per_s=sla_prompt_rate, generation_rate=sla_gen_rate, cumulative=cumulative_sla,
              goodput=goodput)
    capacity = estimate_capacity(config, workload)
    workload = with_rate(workload, config)
    workload.validate()
    seeds = range(seed, seed + replications)
    for name, value in run_config(config, workload, seeds, sla, warmup, cooldown).items():
        click.echo(f"{name + ':':26s}{value}")
    if cost.meta.get("kind") != "measured":
        click.echo(f"  NOT a measured profile (kind {cost.meta.get('kind')!r}): {cost.meta.get('note', '')}")

    kwargs = {"warmup": warmup, "cooldown": cooldown}
    sweep_df = None
    if rates or sweep:
        if workload.arrivals not in ("poisson", "gamma"):
            raise ValueError("--rates/--sweep need open-loop arrivals (--arrivals poisson or gamma)")
        rate_list = _parse_rates(rates) if rates else [capacity * x for x in _linspace(0.2, 1.2, sweep)]
        first = min(SearchConfig.requests_per_replica, max_requests_per_replica // 2)
        search = SearchConfig(target=sla_target, replications=max(replications, 2), seed=seed,
                              max_requests_per_replica=max_requests_per_replica, max_growth=max_queue_growth,
                              requests_per_replica=first)
        parallel = {"backend": backend, "processes": processes, "ray_address": ray_address}
        sweep_df, workload = _sweep_and_search(workload, config, rate_list, search, sla, progress, kwargs, parallel)

    results = [simulate(workload, config, seed=s, progress=progress, token_times=token_times, **kwargs)
               for s in seeds]
    summaries = [summarize(r, sla) for r in results]
    click.echo(summary_table(summaries).to_string())
    if few_replications_warning(len(summaries)):
        click.echo(few_replications_warning(len(summaries)))
    if out:
        ran = run_config(config, workload, seeds, sla, warmup, cooldown)  # a sweep may have changed the rate
        _write_outputs(Path(out), results, summaries, sla, sweep_df, report, token_times, options, ran)


def _sweep_and_search(workload, config, rate_list, search, sla, progress, kwargs, parallel):
    """Print the load sweep's curve, then search for the steady-state capacity from the sweep's bracket; return
    the sweep's frame and the workload at the answer (run as long as the search needed to decide it)."""
    import dataclasses
    import warnings

    from sim.capacity import capacity_answer, capacity_search, load_sweep
    from sim.metrics import few_replications_warning
    from sim.units import format_value, label, number, scale

    sweep_df = load_sweep(workload, config, rate_list, search.seeds, sla, progress=progress, **kwargs, **parallel)
    g = sweep_df.groupby("rate").mean(numeric_only=True)
    cols = ["throughput_rps", "ttft_p95", "tpot_p95", "itl_p95", "sla_share", "effective_throughput_rps",
            "queue_growth", "warmup_requests"]
    table = (g[cols] * [scale(c) for c in cols]).rename(columns=label)  # shares in %
    table.index = [f"{number(r)} req/s" for r in table.index]
    click.echo(f"load sweep: {workload.num_requests:,} requests per run, means over {search.replications} seeds, "
               "each run after its MSER-5 warm-up")
    click.echo(table.to_string(float_format=number))
    guess = capacity_answer(sweep_df, search.target)
    click.echo(f"capacity search: a rate meets when the 95% intervals over {search.replications} replications put "
               f"the share meeting the SLA at >= {search.target:.0%} and the queue's growth at <= "
               f"{number(search.max_growth)} s/s; runs double from {search.requests_per_replica:,} up to "
               f"{search.max_requests_per_replica:,} requests per replica while undecided")
    if few_replications_warning(search.replications):
        click.echo(few_replications_warning(search.replications))

    def show(e):
        click.echo(f"  {format_value('rate', e.rate):>14s}: {e.verdict:9s} share {e.share[0]:.1%} "
                   f"({e.share[1]:.1%} to {e.share[2]:.1%}), queue growth {e.growth[0]:+.4f} s/s, "
                   f"{e.requests:,} requests x {search.replications}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the few-replications warning is printed above
        answer = capacity_search(workload, config, sla, search, low=guess["rate"], high=guess["next_rate"],
                                 on_evaluation=show, **parallel)
    click.echo(f"sustainable rate with >= {search.target:.0%} of requests meeting the SLA in steady state: "
               + ("none" if answer.rate is None else format_value("rate", answer.rate))
               + ("" if answer.misses_at is None else f" (misses at {format_value('rate', answer.misses_at)})"))
    rate = answer.rate or answer.evaluations[0].rate
    n = max(workload.num_requests, answer.requests or 0)
    return sweep_df, dataclasses.replace(workload, rate=rate, num_requests=n)


def _write_outputs(out: Path, results, summaries, sla, sweep_df, report, token_times, options, config_rows) -> None:
    import pandas as pd

    from sim.metrics import audit_frame, confidence_intervals
    from sim.report import write_report

    out.mkdir(parents=True, exist_ok=True)
    written = ["requests.csv", "summary.json"]
    frames = [audit_frame(r, sla).assign(seed=r.seed) for r in results]
    requests = pd.concat(frames, ignore_index=True)
    requests.insert(0, "seed", requests.pop("seed"))
    requests.to_csv(out / "requests.csv", index=False)
    summary = {"config": config_rows, "profile": results[0].config.costs()[0].meta, "options": options,
               "rate": results[0].meta["workload"].rate, "runs": summaries}
    if len(summaries) > 1:
        summary["confidence_intervals"] = confidence_intervals(summaries).to_dict(orient="index")
    if sweep_df is not None:
        summary["sweep"] = sweep_df.to_dict(orient="records")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if token_times:
        times = pd.concat([r.token_times.assign(seed=r.seed) for r in results], ignore_index=True)
        times.to_parquet(out / "token_times.parquet", index=False)
        written.append("token_times.parquet")
    if report != "none":
        write_report(out / "report.html", results, sla, sweep_df, light=report == "light", config=config_rows)
        written.append("report.html")
    click.echo(f"wrote {', '.join(f'{out}/{name}' for name in written)}")


def _require_parquet() -> None:
    try:
        import pyarrow  # noqa: F401  (pandas writes parquet through it)
    except ImportError:
        raise ValueError("--token-times writes parquet through pyarrow, which is not installed: "
                         "pip install pyarrow (or pip install 'splitfuse[parquet]')") from None


def _parse_rates(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates {text!r}: expected comma-separated numbers") from None
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"--rates {text!r}: every rate must be > 0")
    return values


def _linspace(lo: float, hi: float, n: int) -> list[float]:
    if n < 2:
        raise ValueError(f"--sweep needs at least 2 rates, got {n}")
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]
