"""The OpenAI-compatible server on the real engine (tiny model, CPU): the official client, many concurrent
streams, disconnects, and that KV blocks and memory return to idle."""

from __future__ import annotations

import asyncio
import gc
import json

import httpx
import pytest
from serving import byte_tokenizer, metric, serve_in_thread, wait_idle

from engine.llm import LLM, LLMEngine
from engine.policy import SamplingParams
from engine.server.app import create_app
from engine.server.engine_core import EngineSpec

MODEL = "tiny-llama"
NUM_BLOCKS = 1024


@pytest.fixture(scope="module")
def served():
    """The default server: the engine in its own process, this process only serves HTTP."""
    app = create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=NUM_BLOCKS, seed=0)), MODEL)
    server = app.state.server
    if server.tokenizer is None:  # until the tiny model ships one
        server.tokenizer = byte_tokenizer()
    with serve_in_thread(app) as url:
        yield url, server


def prompt_ids(i: int, n: int) -> list[int]:
    return [3 + (i * 31 + 7 * k) % 300 for k in range(n)]


def server_stats(server) -> dict:
    return server.loop.stats()


def rss_bytes(pid: int | str = "self") -> int:
    import os

    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_openai_client_completions(served):
    openai = pytest.importorskip("openai")
    url, server = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    prompt = prompt_ids(1, 12)
    reference = LLM.__new__(LLM)  # the offline pipeline on a twin engine (same seed, same weights)
    reference.engine = LLMEngine(MODEL, device="cpu", num_kv_blocks=64, seed=0)
    expected = reference.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].outputs[0]

    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert choice.model_extra["token_ids"] == expected.token_ids
    assert out.usage.prompt_tokens == 12 and out.usage.completion_tokens == 8

    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    streamed = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    assert streamed == expected.token_ids
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_openai_client_chat(served):
    openai = pytest.importorskip("openai")
    url, server = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == out.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


async def stream_one(client: httpx.AsyncClient, url: str, i: int, max_tokens: int) -> tuple[list[int], str, bool]:
    body = {"model": MODEL, "prompt": prompt_ids(i, 4 + i % 37), "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.8, "seed": i}
    tokens, reason, done = [], None, False
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            choice = json.loads(line[6:])["choices"][0]
            tokens += choice["token_ids"]
            reason = choice["finish_reason"] or reason
    return tokens, reason, done


async def many_streams(url: str, n: int, max_tokens: int):
    limits = httpx.Limits(max_connections=n + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(stream_one(client, url, i, max_tokens) for i in range(n)))


@pytest.mark.slow
def test_200_concurrent_streams_finish_and_return_to_idle(served):
    url, server = served
    asyncio.run(many_streams(url, 20, 4))  # warm up allocator pools and import paths
    wait_idle(server)
    gc.collect()
    engine_pid = server.loop.info["pid"]
    idle_rss, idle_engine_rss = rss_bytes(), rss_bytes(engine_pid)
    busy = metric(url, "splitfuse_engine_busy_seconds_total")

    results = asyncio.run(many_streams(url, 200, 24))
    assert len(results) == 200
    for tokens, reason, done in results:
        assert len(tokens) == 24 and reason == "length" and done
    # seeded sampling: the same request again gives the same tokens, whatever else shares the batch
    again = asyncio.run(many_streams(url, 3, 24))
    assert [r[0] for r in again] == [r[0] for r in results[:3]]

    wait_idle(server)
    assert metric(url, "splitfuse_kv_free_blocks") == NUM_BLOCKS
    assert metric(url, "vllm:num_requests_running") == 0 and metric(url, "vllm:num_requests_waiting") == 0
    assert metric(url, "splitfuse_engine_busy_seconds_total") > busy  # the passes of those 203 requests
    assert not server.loop._streams and not server.loop._timing
    gc.collect()
    assert rss_bytes() - idle_rss < 64 << 20, "memory did not return near its idle level"
    assert rss_bytes(engine_pid) - idle_engine_rss < 64 << 20, "the engine process's memory did not return"


async def disconnect_after(url: str, i: int, chunks: int) -> None:
    body = {"model": MODEL, "prompt": prompt_ids(i, 20), "max_tokens": 900, "stream": True, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= chunks:
                    break  # leaving the block closes the connection mid-stream


def test_disconnect_mid_stream_frees_blocks_at_once(served):
    url, server = served
    wait_idle(server)
    aborted = metric(url, "vllm:request_success_total", finished_reason="abort")

    async def run():
        await asyncio.gather(*(disconnect_after(url, i, 2 + i % 3) for i in range(16)))

    asyncio.run(run())
    # 16 requests of 900 tokens would take many seconds; aborted, the engine is idle almost at once
    assert wait_idle(server, timeout=3.0) < 3.0
    assert metric(url, "vllm:request_success_total", finished_reason="abort") - aborted == 16
    assert server_stats(server)["kv_free_blocks"] == NUM_BLOCKS


def test_non_streaming_client_timeout_aborts(served):
    url, server = served
    wait_idle(server)
    body = {"model": MODEL, "prompt": prompt_ids(5, 10), "max_tokens": 1000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json=body, timeout=0.3)  # 1000 tokens take ~1.6 s on a CPU
    assert wait_idle(server, timeout=3.0) < 3.0


def test_vllm_metric_names_and_labels(served):
    url, server = served
    labels = {"model_name": MODEL}
    before = {name: metric(url, name, **labels) for name in
              ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count",
               "vllm:time_to_first_token_seconds_count", "vllm:time_per_output_token_seconds_count")}
    length = metric(url, "vllm:request_success_total", finished_reason="length", **labels)
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt_ids(2, 7), "max_tokens": 5,
                                                   "ignore_eos": True})
    assert r.status_code == 200
    after = {name: metric(url, name, **labels) for name in before}
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 7
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 5
    assert after["vllm:e2e_request_latency_seconds_count"] - before["vllm:e2e_request_latency_seconds_count"] == 1
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] == 1
    assert after["vllm:time_per_output_token_seconds_count"] - before["vllm:time_per_output_token_seconds_count"] \
        >= 1
    assert metric(url, "vllm:request_success_total", finished_reason="length", **labels) - length == 1
    wait_idle(server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc"):
        assert metric(url, name, **labels) == 0
