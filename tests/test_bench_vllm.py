"""``splitfuse bench`` speaks ``vllm bench serve``: its flags (the old names still work), an infinite default rate,
a progress bar, vLLM's JSON result and ``--goodput`` in vLLM's syntax and milliseconds; against the real server
with the tiny model on the CPU."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner
from serving import serve_in_thread

from engine.server.app import create_app
from engine.server.engine_core import EngineSpec
from sim.bench import run_workload
from sim.bench_cli import bench
from sim.cli import simulate
from sim.workload import Workload

MODEL = "tiny-llama"
VLLM_KEYS = ("date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
             "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
             "itls", "errors", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
             "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms")


@pytest.fixture(scope="module")
def url():
    with serve_in_thread(create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=512, seed=0)), MODEL)) as url:
        yield url


def test_plain_bench_runs_at_an_infinite_rate_with_progress(url):
    result = CliRunner().invoke(bench, ["--base-url", url, "--num-prompts", "6", "--random-input-len", "12",
                                        "--random-output-len", "3"])
    assert result.exit_code == 0, result.output
    assert "request rate inf req/s (closed loop, 6 clients)" in result.output  # every request sent at once
    assert "6/6" in result.output  # tqdm's bar reached the end
    assert "throughput" in result.output


def test_vllm_flags_and_result_json(url, tmp_path):
    args = ["--base-url", url, "--request-rate", "40", "--burstiness", "0.5", "--num-prompts", "12",
            "--dataset-name", "random", "--random-input-len", "20", "--random-output-len", "5",
            "--random-range-ratio", "0.5", "--max-concurrency", "3", "--seed", "2", "--save-result",
            "--result-dir", str(tmp_path), "--metric-percentiles", "50,99", "--percentile-metrics",
            "ttft,tpot,itl,e2el", "--goodput", "ttft:60000", "tpot:60000", "--disable-tqdm"]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("openai-40.0qps-concurrency3-tiny-llama-*.json")  # vLLM's default name
    saved = json.loads(path.read_text())
    assert all(key in saved for key in VLLM_KEYS) and "p50_e2el_ms" in saved
    assert saved["completed"] == 12 and saved["failed"] == 0 and saved["max_concurrency"] == 3
    # --random-range-ratio 0.5 spreads both lengths, as in vLLM: prompts in [10, 30], outputs in [2, 8]
    assert all(10 <= n <= 30 for n in saved["input_lens"]) and all(2 <= n <= 8 for n in saved["output_lens"])
    assert saved["total_output_tokens"] == sum(saved["output_lens"]) and len(set(saved["input_lens"])) > 1
    assert saved["total_input_tokens"] == sum(saved["input_lens"])
    assert saved["request_throughput"] == pytest.approx(12 / saved["duration"])
    assert saved["request_goodput"] == pytest.approx(saved["request_throughput"])  # 60 s limits: all meet them
    assert 0 < saved["mean_ttft_ms"] < 60000 and saved["p99_ttft_ms"] >= saved["median_ttft_ms"]
    assert saved["mean_ttft_ms"] == pytest.approx(1e3 * sum(saved["ttfts"]) / 12)
    gaps = [g for itl in saved["itls"] for g in itl]
    assert len(gaps) >= 12 and saved["mean_itl_ms"] == pytest.approx(1e3 * sum(gaps) / len(gaps))
    assert "gamma, cv 1.41" in result.output


def test_goodput_is_in_milliseconds(url, tmp_path):
    result = CliRunner().invoke(bench, ["--base-url", url, "-n", "4", "--random-input-len", "8",
                                        "--random-output-len", "2", "--goodput", "ttft:0.001", "--save-result",
                                        "--result-dir", str(tmp_path), "--result-filename", "r.json"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["request_goodput"] == 0 and saved["completed"] == 4  # no TTFT is within 1 us


def test_max_concurrency_bounds_requests_in_flight(url):
    table = Workload(num_requests=10, arrivals="poisson", rate=1000.0, prompt="fixed:8", output="fixed:4",
                     max_prompt_tokens=None).generate(0)
    records = asyncio.run(run_workload(url, MODEL, table, [[5] * 8] * 10, 0, 60, max_concurrency=2))
    events = sorted([(r.arrival, 1) for r in records] + [(r.chunk_times[-1], -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert all(r.error is None for r in records) and peak <= 2


@pytest.mark.parametrize("args,message", [
    (["--prompt-len", "fixed:8", "--random-input-len", "8"], "give one of them"),
    (["--burstiness", "0.5", "--cv", "2", "--request-rate", "5"], "give one of them"),
    (["--random-range-ratio", "1"], "--random-range-ratio"),
    (["--metric-percentiles", "100"], "--metric-percentiles"),
    (["--goodput", "ttft:2,tpot:0.1"], "not comma-separated seconds"),
    (["--goodput", "ttft:200", "itl:5"], "unknown metric 'itl'"),
    (["stray"], "unexpected argument"),
])
def test_bad_flags_name_themselves(url, args, message):
    result = CliRunner().invoke(bench, ["--base-url", url, *args])
    assert result.exit_code == 2 and message in result.output


def test_simulate_reads_goodput_as_vllm_does():
    result = CliRunner().invoke(simulate, ["--profile", "builtin-llama-2-7b", "--replicas", "1", "-n", "40",
                                           "--rate", "1", "--goodput", "ttft:200", "tpot:50", "--report", "none"])
    assert result.exit_code == 0, result.output
    assert "ttft 200 ms, tpot 50 ms" in result.output


def test_simulate_caps_an_open_loop_as_vllm_does():
    result = CliRunner().invoke(simulate, ["--profile", "builtin-llama-2-7b", "--replicas", "1", "-n", "40",
                                           "--rate", "50", "--max-concurrency", "4", "--report", "none"])
    assert result.exit_code == 0, result.output
    assert "poisson, at most 4 in flight" in result.output
    result = CliRunner().invoke(simulate, ["--profile", "builtin-llama-2-7b", "--arrivals", "closed", "--clients", "2",
                                           "--max-concurrency", "4"])
    assert result.exit_code == 2 and "a closed loop's cap is its --clients" in result.output
