"""``splitfuse bench``: drive any OpenAI-compatible server and report latency and throughput exactly as
``splitfuse simulate`` does (the simulator's ``sim.metrics.summarize`` on the same columns), so measured and
simulated runs line up in one table.

Workloads are the simulator's (``sim.workload``): open loop with Poisson or gamma arrivals (as ``vllm bench
serve``) or closed loop with N clients (as DeepSpeed-FastGen's benchmark), lengths as in ``--prompt-len``.
Each request streams from ``/v1/completions`` with ``ignore_eos`` so it produces exactly its output length.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import numpy as np

from sim.request_log import RequestLog
from sim.sla_options import sla_options


@dataclass
class Record:
    """One request as the client saw it; times are seconds since the benchmark started."""

    id: int
    prompt_tokens: int
    max_tokens: int
    arrival: float = float("nan")
    chunk_times: list[float] = field(default_factory=list)  # one per streamed event that carried tokens
    output_tokens: int = 0
    error: str | None = None
    response_id: str | None = None  # the server's id of the completion


def make_prompts(rng: np.random.Generator, lengths: np.ndarray, vocab_size: int | None) -> list:
    """Random token-id prompts of the given lengths (ids 3.. to skip BOS/EOS), or word prompts without a vocab."""
    if vocab_size:
        return [rng.integers(3, vocab_size, size=int(n)).tolist() for n in lengths]
    words = np.array(["alpha", "beta", "gamma", "delta", "echo", "fox", "golf", "hotel"])
    return [" ".join(rng.choice(words, size=int(n))) for n in lengths]


async def send(client, url: str, model: str, prompt, record: Record, t0: float) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": record.max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    record.arrival = time.perf_counter() - t0
    usage_tokens = None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                record.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter() - t0
                event = json.loads(line[6:])
                if record.response_id is None:
                    record.response_id = event.get("id")
                if "error" in event:
                    record.error = event["error"].get("message", str(event))
                    return
                if event.get("usage"):
                    usage_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    n = len(choice["token_ids"]) if "token_ids" in choice else int(bool(choice.get("text")))
                    if n:
                        record.chunk_times.append(now)
                        record.output_tokens += n
    except Exception as e:  # a transport failure is a failed request, reported, not a crash of the benchmark
        record.error = repr(e)
        return
    if usage_tokens is not None:
        record.output_tokens = usage_tokens
    if not record.chunk_times:
        record.error = "no tokens received"


async def run_workload(url: str, model: str, table, prompts: list, clients: int, timeout: float,
                       t0: float | None = None, ids=None) -> list[Record]:
    """Send every request (open or closed loop); times are seconds since ``t0`` (a ``time.perf_counter`` value,
    system-wide on Linux, so client processes started together can share it; default: now). ``ids``: send only
    these rows of ``table`` (one client process's share)."""
    import httpx

    ids = range(len(table)) if ids is None else ids
    records = {i: Record(i, int(table.prompt_tokens[i]), int(table.output_tokens[i])) for i in ids}
    limits = httpx.Limits(max_connections=max(clients, 1) + 1024)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10), limits=limits) as client:
        t0 = time.perf_counter() if t0 is None else t0
        if table.arrivals is not None:  # open loop: send at the scheduled times, whatever the server does
            async def at(i: int) -> None:
                await asyncio.sleep(max(0.0, t0 + float(table.arrivals[i]) - time.perf_counter()))
                await send(client, url, model, prompts[i], records[i], t0)

            await asyncio.gather(*(at(i) for i in records))
        else:  # closed loop: each client sends its next request when the last one finishes
            next_id = iter(records)

            async def worker() -> None:
                for i in next_id:
                    await send(client, url, model, prompts[i], records[i], t0)

            await asyncio.gather(*(worker() for _ in range(clients)))
    return list(records.values())


def run_spread(url: str, model: str, table, prompts: list, clients: int, timeout: float,
               processes: int = 1, t0: float | None = None) -> list[Record]:
    """``run_workload`` spread over ``processes`` client processes that share one clock origin ``t0`` (default:
    0.2 s from now, so every process is up before the first arrival): one Python process parsing thousands of
    streamed events a second lags the server it measures. Process p sends rows p, p + processes, ...; in closed
    loop it runs its share of the ``clients``. Records come back in row order."""
    t0 = time.perf_counter() + 0.2 if t0 is None else t0
    if table.arrivals is None:  # closed loop: every process runs one client at least
        processes = min(processes, clients)
    if processes <= 1:
        return asyncio.run(run_workload(url, model, table, prompts, clients, timeout, t0))
    import multiprocessing

    shares = [(url, model, table, prompts, clients // processes + (p < clients % processes), timeout, t0,
               range(p, len(table), processes)) for p in range(min(processes, len(table)))]
    with multiprocessing.get_context("fork").Pool(len(shares)) as pool:
        parts = pool.starmap(_run_share, shares)
    return sorted((r for part in parts for r in part), key=lambda r: r.id)


def _run_share(url, model, table, prompts, clients, timeout, t0, ids) -> list[Record]:
    return asyncio.run(run_workload(url, model, table, prompts, clients, timeout, t0, ids))


@dataclass
class MeasuredRun:
    """Requests measured at the client, in the simulator's columns (``RequestLog``), so that
    ``sim.metrics.summarize`` judges them exactly as it judges a ``SimResult``. ``replica_rows``: the server's
    counters (preemptions, passes, tokens per pass) where it reports them."""

    columns: dict
    log: RequestLog
    replica_rows: list[dict]
    seed: int

    @property
    def requests(self):
        import pandas as pd

        return pd.DataFrame(self.columns)


def to_result(records: list[Record], seed: int, server_stats: dict | None = None) -> MeasuredRun:
    """The completed requests as the simulator records its own. A client does not see when a request was first
    scheduled, nor its preemptions or cached tokens: queue delay is NaN and those columns are left out."""
    log = RequestLog()
    for r in records:
        if r.error is None:
            log.add(r.id, 0, r.arrival, None, r.chunk_times[0], r.chunk_times[-1], r.prompt_tokens, r.output_tokens,
                    0, 0, r.chunk_times)
    columns = log.to_columns()
    del columns["preemptions"], columns["cached_tokens"]
    s = server_stats or {}
    replica = {"preemptions": s.get("preemptions", 0), "busy_share": np.nan,
               "mean_tokens_per_pass": s.get("mean_tokens_per_pass", np.nan), "passes": s.get("passes", 0)}
    return MeasuredRun(columns, log, [replica], seed)


def scrape(url: str) -> dict:
    """Preemptions and tokens-per-pass totals from a splitfuse server's /metrics (empty for other servers)."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("splitfuse_preemptions_total", "splitfuse_tokens_per_pass_sum", "splitfuse_tokens_per_pass_count",
                    "splitfuse_engine_busy_seconds_total"):
            values[name] = float(value)
    return values


def server_delta(before: dict, after: dict) -> dict:
    if not after:
        return {}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    passes = d.get("splitfuse_tokens_per_pass_count", 0)
    return {"preemptions": int(d.get("splitfuse_preemptions_total", 0)), "passes": int(passes),
            "mean_tokens_per_pass": d.get("splitfuse_tokens_per_pass_sum", 0) / passes if passes else np.nan,
            "engine_busy_s": d.get("splitfuse_engine_busy_seconds_total", np.nan)}


@click.command()
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True, help="Server to drive.")
@click.option("--model", default=None, help="Model name to send (default: the server's first in /v1/models).")
@click.option("--arrivals", type=click.Choice(["poisson", "gamma", "closed"]), default="poisson", show_default=True)
@click.option("--rate", type=float, default=None, help="Open loop: requests/s.")
@click.option("--cv", type=float, default=1.0, show_default=True, help="Gamma arrivals' coefficient of variation.")
@click.option("--clients", type=int, default=0, help="Closed loop: concurrent clients.")
@click.option("--num-requests", "-n", type=int, default=200, show_default=True)
@click.option("--prompt-len", default="normal:256:0.3", show_default=True,
              help="fixed:N, uniform:LO:HI, normal:MEAN:REL, lognormal:MEAN:SIGMA or file:PATH:COLUMN.")
@click.option("--output-len", default="normal:64:0.3", show_default=True, help="Same forms as --prompt-len.")
@click.option("--max-prompt-len", type=int, default=None, help="Clip sampled prompts to this many tokens.")
@click.option("--vocab-size", type=int, default=None,
              help="Token ids for random prompts (default: the server's vocab_size; text prompts if unknown).")
@click.option("--seed", type=int, default=0, show_default=True)
@sla_options
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds per request.")
@click.option("--client-processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Client processes to spread the requests over (one process can lag a fast server).")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write requests.csv and summary.json.")
def bench(base_url, model, arrivals, rate, cv, clients, num_requests, prompt_len, output_len, max_prompt_len,
          vocab_size, seed, sla_gen_rate, sla_prompt_rate, cumulative_sla, goodput, timeout, client_processes, out):
    """Benchmark any OpenAI-compatible server; prints the simulator's summary table."""
    import httpx

    from sim.metrics import SLA, audit_frame, parse_goodput, summarize, summary_table
    from sim.workload import Workload, parse_length

    url = base_url.rstrip("/")
    try:
        sla = SLA(prompt_tokens_per_s=sla_prompt_rate, generation_rate=sla_gen_rate, cumulative=cumulative_sla,
                  goodput=parse_goodput(goodput))
        workload = Workload(num_requests=num_requests, arrivals=arrivals, rate=rate, cv=cv, clients=clients,
                            prompt=parse_length(prompt_len), output=parse_length(output_len, "--output-len"),
                            max_prompt_tokens=max_prompt_len)
        table = workload.generate(seed)
        info = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except httpx.HTTPError as e:
        raise click.ClickException(f"cannot reach {url}/v1/models: {e!r}") from None
    model = model or info["id"]
    vocab_size = vocab_size or info.get("vocab_size")
    prompts = make_prompts(np.random.default_rng([seed, 0xB0]), table.prompt_tokens, vocab_size)
    click.echo(f"server: {url} model {model}; workload: {arrivals}"
               + (f" at {rate:.3g} req/s" if rate else f" with {clients} clients") + f", {num_requests} requests")

    before = scrape(url)
    records = run_spread(url, model, table, prompts, clients, timeout, client_processes)
    result = to_result(records, seed, server_delta(before, scrape(url)))
    summary = summarize(result, sla)
    failed = [r for r in records if r.error is not None]
    summary["failed"] = len(failed)
    click.echo(summary_table([summary]).to_string())
    for r in failed[:5]:
        click.echo(f"  request {r.id} failed: {r.error}", err=True)
    if out:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        audit_frame(result, sla).to_csv(out / "requests.csv", index=False)
        options = {"base_url": url, "model": model, "arrivals": arrivals, "rate": rate, "cv": cv, "clients": clients,
                   "num_requests": num_requests, "prompt_len": prompt_len, "output_len": output_len, "seed": seed}
        (out / "summary.json").write_text(json.dumps({"options": options, "runs": [summary]}, indent=1,
                                                     default=str))
        click.echo(f"wrote {out}/requests.csv, summary.json")
