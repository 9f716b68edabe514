"""``splitfuse bench --save-result``: a run in ``vllm bench serve``'s JSON result shape, so tools that read vLLM's
results read ours (``completed``, ``total_input_tokens``, ``request_throughput``, ``mean_ttft_ms``, ``p99_itl_ms``,
...). Latencies come from the same per-request columns the simulator's summary reads (``MeasuredRun.columns``);
ITL is every gap between consecutive streamed chunks, as vLLM measures it."""

from __future__ import annotations

import datetime
import math
import re

import numpy as np

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


def parse_percentiles(text: str) -> list[float]:
    """``--metric-percentiles "50,90,99"`` -> [50.0, 90.0, 99.0]; ValueError names the flag."""
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values or not all(0 < p < 100 for p in values):
        raise ValueError(f"--metric-percentiles {text!r}: expected comma-separated percentiles in (0, 100), e.g. 99")
    return values


def parse_metrics(text: str) -> list[str]:
    """``--percentile-metrics "ttft,tpot,itl"`` -> the metric names; ValueError names an unknown one."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in PERCENTILE_METRICS]
    if bad or not names:
        raise ValueError(f"--percentile-metrics {text!r}: choose from {', '.join(PERCENTILE_METRICS)}")
    return names


def _stats(name: str, seconds: np.ndarray, percentiles: list[float]) -> dict:
    ms = np.asarray(seconds, dtype=float) * 1e3
    ms = ms[np.isfinite(ms)]
    if not len(ms):
        ms = np.zeros(1)  # vLLM reports 0 for a metric with no samples
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(ms.std())}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def vllm_result(records: list, run, duration: float, goodput: dict, percentiles: list[float],
                metrics: list[str]) -> dict:
    """vLLM's result dict for ``records`` (``sim.bench.Record``s, failed ones included) whose completed requests
    are ``run`` (``sim.bench.to_result``), over a benchmark of ``duration`` seconds. ``goodput``: ``SLA.goodput``
    limits in seconds (``request_goodput`` is None without them)."""
    cols = run.columns
    ok = [r for r in records if r.error is None]
    ttft_of = dict(zip(cols["id"].tolist(), cols["ttft"].tolist()))
    itls = [np.diff(r.chunk_times).tolist() if r.error is None else [] for r in records]
    series = {"ttft": cols["ttft"], "tpot": cols["tpot"], "e2el": cols["e2e"],
              "itl": np.array([gap for gaps in itls for gap in gaps], dtype=float)}
    total_in = int(np.sum(cols["prompt_tokens"]))
    total_out = int(np.sum(cols["output_tokens"]))
    good = None
    if goodput:
        meets = np.ones(len(cols["ttft"]), dtype=bool)
        for key, limit in goodput.items():
            meets &= np.nan_to_num(np.asarray(cols[key], dtype=float), nan=0.0) <= limit
        good = int(meets.sum()) / duration
    result = {
        "duration": duration, "completed": len(ok), "failed": len(records) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "request_goodput": good,
        "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
        # per request, failed ones included (0 tokens, TTFT 0, the error), as vLLM lists them
        "input_lens": [r.prompt_tokens for r in records],
        "output_lens": [r.output_tokens if r.error is None else 0 for r in records],
        "ttfts": [ttft_of.get(r.id, 0.0) for r in records], "itls": itls, "generated_texts": [""] * len(records),
        "errors": [r.error or "" for r in records],
    }
    for name in metrics:
        result.update(_stats(name, series[name], percentiles))
    return result


def result_header(model: str, num_prompts: int, request_rate: float, burstiness: float,
                  max_concurrency: int | None) -> dict:
    """The keys ``vllm bench serve`` puts before the metrics (``date`` as vLLM writes it: %Y%m%d-%H%M%S)."""
    return {"date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai", "model_id": model,
            "tokenizer_id": model, "num_prompts": num_prompts,
            "request_rate": request_rate if math.isfinite(request_rate) else "inf",
            "burstiness": burstiness, "max_concurrency": max_concurrency}


def result_filename(header: dict) -> str:
    """vLLM's default name: ``openai-{rate}qps[-concurrency{N}]-{model}-{date}.json``."""
    concurrency = f"-concurrency{header['max_concurrency']}" if header["max_concurrency"] else ""
    model = re.sub(r"[^\w.-]", "_", str(header["model_id"]).rstrip("/").split("/")[-1])
    rate = header["request_rate"]
    return f"{header['backend']}-{rate}qps{concurrency}-{model}-{header['date']}.json"
