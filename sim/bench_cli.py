"""``splitfuse bench``: the command line of the benchmark client (``sim.bench``), in ``vllm bench serve``'s flags,
the earlier names kept as aliases."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import click
import numpy as np

from sim.bench import make_prompts, run_spread, scrape, server_delta, to_result
from sim.sla_options import SLA_CONTEXT, sla_options

RANDOM_DEFAULTS = {"random_input_len": 1024, "random_output_len": 128, "random_range_ratio": 0.0}  # vLLM's
DEFAULT_PROMPT_LEN, DEFAULT_OUTPUT_LEN = "normal:256:0.3", "normal:64:0.3"


def random_lengths(input_len: int, output_len: int, range_ratio: float) -> tuple[str, str]:
    """vLLM's random dataset as length specs: uniform integers in [floor(L(1 - r)), ceil(L(1 + r))]."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")

    def spec(length: int, flag: str) -> str:
        if length < 1:
            raise ValueError(f"{flag} must be >= 1, got {length}")
        lo, hi = max(1, math.floor(length * (1 - range_ratio))), math.ceil(length * (1 + range_ratio))
        return f"fixed:{length}" if lo == hi else f"uniform:{lo}:{hi}"

    return spec(input_len, "--random-input-len"), spec(output_len, "--random-output-len")


def lengths(dataset_name, random_flags: dict, prompt_len, output_len) -> tuple[str, str]:
    """The prompt and output length specs: vLLM's random dataset when ``--dataset-name random`` or a
    ``--random-*`` flag is given (vLLM's defaults for the others), else ``--prompt-len``/``--output-len``."""
    given = {k: v for k, v in random_flags.items() if v is not None}
    if dataset_name is None and not given:
        return prompt_len or DEFAULT_PROMPT_LEN, output_len or DEFAULT_OUTPUT_LEN
    if prompt_len or output_len:
        raise ValueError("--prompt-len/--output-len and --dataset-name random/--random-* both set the lengths; "
                         "give one of them")
    values = {**RANDOM_DEFAULTS, **given}
    return random_lengths(values["random_input_len"], values["random_output_len"], values["random_range_ratio"])


def workload_shape(arrivals, request_rate: float, burstiness, cv, max_concurrency, num_prompts) -> dict:
    """``Workload`` arrival fields from vLLM's flags: an infinite rate sends every request at once (a closed loop
    of ``max_concurrency`` clients, or of one client per request); a finite one is Poisson, or gamma with vLLM's
    ``burstiness`` (shape; cv = 1/sqrt(burstiness)) or ``--cv``; ``--arrivals closed`` is a closed loop of
    ``--max-concurrency``/``--clients`` clients. An open loop keeps ``max_concurrency`` as its cap on requests in
    flight (``Workload.max_concurrency``)."""
    if burstiness is not None and cv is not None:
        raise ValueError("--burstiness and --cv both set the gamma arrivals' spread; give one of them")
    if burstiness is not None and not burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    if arrivals == "closed":
        return {"arrivals": "closed", "clients": max_concurrency or 0}
    if not request_rate > 0:
        raise ValueError(f"--request-rate must be > 0 requests/s (inf: all at once), got {request_rate}")
    if math.isinf(request_rate):
        return {"arrivals": "closed", "clients": max_concurrency or num_prompts}
    if burstiness is not None:
        cv = 1 / math.sqrt(burstiness)
    kind = arrivals or ("gamma" if cv is not None and cv != 1 else "poisson")
    return {"arrivals": kind, "rate": request_rate, "cv": 1.0 if cv is None else cv, "max_concurrency": max_concurrency}


@click.command(context_settings=SLA_CONTEXT)
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True, help="Server to drive.")
@click.option("--model", default=None, help="Model name to send (default: the server's first in /v1/models).")
@click.option("--request-rate", "--rate", "request_rate", type=float, default=float("inf"), show_default=True,
              help="Requests/s, Poisson (or gamma: --burstiness); inf sends every request at once, as vLLM.")
@click.option("--burstiness", type=float, default=None,
              help="vLLM's gamma shape of the arrivals: 1 is Poisson, < 1 burstier (cv = 1/sqrt(burstiness)).")
@click.option("--max-concurrency", "--clients", "max_concurrency", type=int, default=None,
              help="Most requests in flight; with an infinite rate, a closed loop of this many clients.")
@click.option("--num-prompts", "--num-requests", "-n", "num_prompts", type=int, default=200, show_default=True)
@click.option("--dataset-name", type=click.Choice(["random"]), default=None,
              help="vLLM's random dataset: random token ids of --random-input-len tokens.")
@click.option("--random-input-len", type=int, default=None, help="Prompt tokens (default 1024, as vLLM).")
@click.option("--random-output-len", type=int, default=None, help="Output tokens (default 128, as vLLM).")
@click.option("--random-range-ratio", type=float, default=None,
              help="Lengths uniform in [L(1 - r), L(1 + r)] (default 0: fixed).")
@click.option("--arrivals", type=click.Choice(["poisson", "gamma", "closed"]), default=None,
              help="Arrival process (default: poisson at a finite rate).")
@click.option("--cv", type=float, default=None, help="Gamma arrivals' coefficient of variation.")
@click.option("--prompt-len", default=None, help=f"fixed:N, uniform:LO:HI, normal:MEAN:REL, lognormal:MEAN:SIGMA "
              f"or file:PATH:COLUMN (default {DEFAULT_PROMPT_LEN}; or the --random-* flags).")
@click.option("--output-len", default=None, help=f"Same forms as --prompt-len (default {DEFAULT_OUTPUT_LEN}).")
@click.option("--max-prompt-len", type=int, default=None, help="Clip sampled prompts to this many tokens.")
@click.option("--vocab-size", type=int, default=None,
              help="Token ids for random prompts (default: the server's vocab_size; text prompts if unknown).")
@click.option("--seed", type=int, default=0, show_default=True)
@sla_options
@click.option("--metric-percentiles", default="99", show_default=True,
              help="Percentiles of --save-result's latencies, comma-separated.")
@click.option("--percentile-metrics", default="ttft,tpot,itl", show_default=True,
              help="Latencies --save-result reports: ttft, tpot, itl, e2el.")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="Every request's sampling temperature (0: greedy); default: the server's (1.0 on splitfuse's).")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds per request.")
@click.option("--client-processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Client processes to spread the requests over (one process can lag a fast server).")
@click.option("--disable-tqdm", is_flag=True, help="No progress bar.")
@click.option("--save-result", is_flag=True, help="Write the run as vllm bench serve's JSON result.")
@click.option("--result-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of --save-result's file (default: the current one).")
@click.option("--result-filename", default=None,
              help="--save-result's file name (default vLLM's: openai-{rate}qps-{model}-{date}.json).")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write requests.csv and summary.json.")
def bench(base_url, model, request_rate, burstiness, max_concurrency, num_prompts, dataset_name, random_input_len,
          random_output_len, random_range_ratio, arrivals, cv, prompt_len, output_len, max_prompt_len, vocab_size,
          seed, sla_gen_rate, sla_prompt_rate, cumulative_sla, goodput, metric_percentiles, percentile_metrics,
          temperature, timeout, client_processes, disable_tqdm, save_result, result_dir, result_filename, out):
    """Benchmark any OpenAI-compatible server; prints the simulator's summary table."""
    import httpx

    from sim.bench_result import parse_metrics, parse_percentiles
    from sim.metrics import SLA
    from sim.workload import Workload, parse_length

    url = base_url.rstrip("/")
    try:
        sla = SLA(prompt_tokens_per_s=sla_prompt_rate, generation_rate=sla_gen_rate, cumulative=cumulative_sla,
                  goodput=goodput)
        percentiles, metrics = parse_percentiles(metric_percentiles), parse_metrics(percentile_metrics)
        prompt_spec, output_spec = lengths(dataset_name, {"random_input_len": random_input_len,
                                                          "random_output_len": random_output_len,
                                                          "random_range_ratio": random_range_ratio},
                                           prompt_len, output_len)
        shape = workload_shape(arrivals, request_rate, burstiness, cv, max_concurrency, num_prompts)
        workload = Workload(num_requests=num_prompts, prompt=parse_length(prompt_spec),
                            output=parse_length(output_spec, "--output-len"), max_prompt_tokens=max_prompt_len,
                            **shape)
        table = workload.generate(seed)
        info = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except httpx.HTTPError as e:
        raise click.ClickException(f"cannot reach {url}/v1/models: {e!r}") from None
    model = model or info["id"]
    vocab_size = vocab_size or info.get("vocab_size")
    prompts = make_prompts(np.random.default_rng([seed, 0xB0]), table.prompt_tokens, vocab_size)
    click.echo(f"server: {url} model {model}; {num_prompts} requests, prompts {prompt_spec}, outputs {output_spec}; "
               f"request rate {request_rate:g} req/s ({_describe(shape)}), max concurrency {max_concurrency}")

    before = scrape(url)
    t0 = time.perf_counter() + 0.2
    records = run_spread(url, model, table, prompts, shape.get("clients", 0), timeout, client_processes, t0,
                         workload.max_concurrency, progress=not disable_tqdm,
                         extra_body=None if temperature is None else {"temperature": temperature})
    duration = time.perf_counter() - t0
    result = to_result(records, seed, server_delta(before, scrape(url)))
    _report(result, records, sla, out, {
        "base_url": url, "model": model, "request_rate": request_rate if math.isfinite(request_rate) else "inf",
        "burstiness": burstiness,
        "max_concurrency": max_concurrency, "arrivals": shape["arrivals"], "num_prompts": num_prompts,
        "prompt_len": prompt_spec, "output_len": output_spec, "seed": seed, "temperature": temperature})
    if save_result:
        from sim.bench_result import result_filename as default_name
        from sim.bench_result import result_header, vllm_result

        header = result_header(model, num_prompts, request_rate, 1.0 if burstiness is None else burstiness,
                               max_concurrency)
        path = Path(result_dir or ".") / (result_filename or default_name(header))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**header, **vllm_result(records, result, duration, sla.goodput, percentiles,
                                                            metrics)}, indent=1))
        click.echo(f"wrote {path}")


def _describe(shape: dict) -> str:
    if shape["arrivals"] == "closed":
        return f"closed loop, {shape['clients']} clients"
    return (shape["arrivals"] + (f", cv {shape['cv']:g}" if shape["arrivals"] == "gamma" else "")
            + (f", at most {shape['max_concurrency']} in flight" if shape["max_concurrency"] else ""))


def _report(result, records, sla, out, options: dict) -> None:
    """Print the simulator's summary table (and the first failures); with ``out``, write requests.csv and
    summary.json."""
    from sim.metrics import audit_frame, summarize, summary_table

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
        (out / "summary.json").write_text(json.dumps({"options": options, "runs": [summary]}, indent=1,
                                                     default=str))
        click.echo(f"wrote {out}/requests.csv, summary.json")
