"""``splitfuse serve --replicas 3``: the router spreads requests with the simulator's balancer, and killing a
replica mid-load loses no request silently while the others keep serving."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from engine.server.router import free_port

MODEL = "tiny-llama"
MAX_TOKENS = 80


@pytest.fixture(scope="module")
def router():
    port = free_port()
    cmd = [sys.executable, "-m", "engine.server.cli", MODEL, "--port", str(port), "--replicas", "3",
           "--balancer", "round-robin", "--device", "cpu", "--num-kv-blocks", "512", "--threads", "1",
           "--kv-report-interval", "0.2"]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, "the router exited while starting"
        assert time.monotonic() < deadline, "the router did not start"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pids = [r["pid"] for r in httpx.get(url + "/health").json()["replicas"]]
    yield url
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    for pid in pids:  # the router stopped (and reaped) its replicas before exiting
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def replicas(url: str) -> list[dict]:
    return httpx.get(url + "/health").json()["replicas"]


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def served_by(replica_url: str) -> float:
    return metric(replica_url, "splitfuse_requests_length_total")


def test_round_robin_spreads_requests(router):
    before = [served_by(r["url"]) for r in replicas(router)]
    for i in range(9):
        r = httpx.post(router + "/v1/completions", json={"model": MODEL, "prompt": [3 + i, 4], "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 2
    after = [served_by(r["url"]) for r in replicas(router)]
    assert [a - b for a, b in zip(after, before)] == [3, 3, 3]


async def one(client: httpx.AsyncClient, url: str, i: int) -> tuple[str, int, str]:
    """('ok', tokens, '') or ('error', tokens, message); raises if a request ends silently incomplete."""
    body = {"model": MODEL, "prompt": [5 + i % 50] * (4 + i % 20), "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": i % 4 != 0}
    if not body["stream"]:
        r = await client.post(url + "/v1/completions", json=body)
        if r.status_code == 200:
            return "ok", len(r.json()["choices"][0]["token_ids"]), ""
        return "error", 0, r.json()["error"]["message"]
    tokens, done = 0, False
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return "error", 0, json.loads(await r.aread())["error"]["message"]
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    return "error", tokens, event["error"]["message"]
                tokens += len(event["choices"][0]["token_ids"])
    assert done, f"request {i} ended silently after {tokens} tokens"
    return "ok", tokens, ""


async def load_and_kill(url: str, n: int, victim: dict):
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n + 10)) as client:
        tasks = [asyncio.create_task(one(client, url, i)) for i in range(n)]
        deadline = time.monotonic() + 30
        while (await client.get(url + "/health")).json()["replicas"][victim["index"]]["outstanding_requests"] < 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # let some tokens flow first
        os.kill(victim["pid"], signal.SIGKILL)
        return await asyncio.gather(*tasks)


def test_killed_replica_loses_no_request_silently(router):
    victim = replicas(router)[1]
    results = asyncio.run(load_and_kill(router, 48, victim))
    ok = [r for r in results if r[0] == "ok"]
    errors = [r for r in results if r[0] == "error"]
    assert all(tokens == MAX_TOKENS for _, tokens, _ in ok)
    assert all("replica" in msg and "mid-stream" in msg for _, _, msg in errors), errors
    broken = metric(router, "splitfuse_router_broken_streams_total")
    retries = metric(router, "splitfuse_router_retries_total")
    assert broken == len(errors) and broken + retries > 0, "the kill hit no request: the test proved nothing"
    assert len(ok) + len(errors) == 48

    state = replicas(router)[1]
    assert not state["healthy"] and state["dead"]
    for i in range(6):  # the rest keep serving
        r = httpx.post(router + "/v1/completions", json={"model": MODEL, "prompt": [7, i + 3], "max_tokens": 3,
                                                            "ignore_eos": True},
                       timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3
