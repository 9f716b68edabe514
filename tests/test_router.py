"""``splitfuse serve --replicas 3``: the router spreads requests with the simulator's balancer, and killing a
replica's engine mid-load loses no request silently while the others keep serving; the router restarts the
replica, which is back in rotation once its health check passes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

import httpx
import psutil
import pytest
from serving import metric, start_cli

MODEL = "tiny-llama"
MAX_TOKENS = 80
ROUTERS: dict[str, subprocess.Popen] = {}  # the router's process by its URL
RESTART_BUDGET_S = 60.0  # 1 s backoff + a replica's start on a shared 2-core CI machine


@pytest.fixture(scope="module")
def router():
    proc, url = start_cli("--replicas", "3", "--balancer", "round-robin", "--num-kv-blocks", "512",
                          "--kv-report-interval", "0.2", timeout=120)
    ROUTERS[url] = proc
    yield url
    pids = [replica_process(url, r).pid for r in replicas(url)]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    for pid in pids:  # the router stopped (and reaped) its replicas before exiting
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def replicas(url: str) -> list[dict]:
    return httpx.get(url + "/health").json()["replicas"]


def replica_process(url: str, replica: dict) -> psutil.Process:
    """The router's child that serves ``replica`` (found by its port: /health shows no pids)."""
    port = replica["url"].rsplit(":", 1)[1]
    for child in psutil.Process(ROUTERS[url].pid).children():
        cmd = child.cmdline()
        if "--port" in cmd and cmd[cmd.index("--port") + 1] == port:
            return child
    raise LookupError(f"no process serves {replica['url']}")


def engine_process(url: str, replica: dict) -> psutil.Process:
    children = [c for c in replica_process(url, replica).children() if "resource_tracker" not in " ".join(c.cmdline())]
    assert len(children) == 1, children
    return children[0]


def served_by(replica_url: str) -> float:
    return metric(replica_url, "vllm:request_success_total", finished_reason="length")


def test_round_robin_spreads_requests_and_the_router_aggregates_metrics(router):
    before = [served_by(r["url"]) for r in replicas(router)]
    fleet = served_by(router)  # the replicas' metrics, each labelled with its replica
    for i in range(9):
        r = httpx.post(router + "/v1/completions", json={"model": MODEL, "prompt": [3 + i, 4], "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 2
    after = [served_by(r["url"]) for r in replicas(router)]
    assert [a - b for a, b in zip(after, before)] == [3, 3, 3]
    assert served_by(router) - fleet == 9
    for r in replicas(router):
        assert metric(router, "vllm:request_success_total", finished_reason="length", replica=str(r["index"])) \
            == served_by(r["url"])


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


async def load_and_kill(url: str, n: int, victim: dict, engine_pid: int):
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n + 10)) as client:
        tasks = [asyncio.create_task(one(client, url, i)) for i in range(n)]
        deadline = time.monotonic() + 30
        while (await client.get(url + "/health")).json()["replicas"][victim["index"]]["outstanding_requests"] < 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # let some tokens flow first
        os.kill(engine_pid, signal.SIGKILL)  # the replica's engine: the replica exits 1, the router restarts it
        return await asyncio.gather(*tasks)


def test_killed_engine_loses_no_request_silently_and_its_replica_comes_back(router):
    victim = replicas(router)[1]
    old = replica_process(router, victim).pid
    results = asyncio.run(load_and_kill(router, 48, victim, engine_process(router, victim).pid))
    killed = time.monotonic()
    ok = [r for r in results if r[0] == "ok"]
    errors = [r for r in results if r[0] == "error"]
    assert all(tokens == MAX_TOKENS for _, tokens, _ in ok)
    assert all("engine" in msg or "replica" in msg for _, _, msg in errors), errors
    retries = metric(router, "splitfuse_router_retries_total")
    assert errors or retries > 0, "the kill hit no request: the test proved nothing"
    assert len(ok) + len(errors) == 48

    deadline = killed + RESTART_BUDGET_S
    # healthy and restarted: on a loaded machine the router may not yet have seen the kill when the load ends
    while not ((state := replicas(router)[1])["healthy"] and state["restarts"] >= 1):
        assert time.monotonic() < deadline, f"the replica is not back after {RESTART_BUDGET_S} s: {state}"
        time.sleep(0.2)
    assert state["restarts"] == 1 and not state["dead"] and replica_process(router, victim).pid != old
    before = served_by(victim["url"])
    for i in range(6):  # all three serve again, the restarted one included
        r = httpx.post(router + "/v1/completions", json={"model": MODEL, "prompt": [7, i + 3], "max_tokens": 3,
                                                            "ignore_eos": True},
                       timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3
    assert served_by(victim["url"]) - before == 2


def test_the_router_answers_errors_as_a_server_does(router):
    """The router has the server's guards (OpenAI error objects, 404/415/431) and relays the replicas' 404. The
    header is over the 16 KiB limit but arrives in one read: with 64 KiB, h11 stopped reading mid-request and the
    close could reset the connection before the client read the 431."""
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 2}
    for r, status in ((httpx.get(router + "/v1/nothing"), 404),
                      (httpx.post(router + "/v1/completions", content=json.dumps(body),
                                  headers={"content-type": "text/plain"}), 415),
                      (httpx.post(router + "/v1/completions", json=body, headers={"x-big": "a" * 20_000}), 431),
                      (httpx.post(router + "/v1/completions", json={**body, "model": "gpt-9"}), 404)):
        assert r.status_code == status and r.json()["error"]["code"] == status, r.text
    assert not any("pid" in key for replica in replicas(router) for key in replica)


def test_clients_drop_idle_connections_before_a_server_closes_them():
    # at equal timeouts a client can reuse a keep-alive connection the server is closing (a ReadError)
    from engine.server.config import CLIENT_KEEPALIVE_EXPIRY_S, ServerConfig

    assert 0 < CLIENT_KEEPALIVE_EXPIRY_S <= ServerConfig().timeout_keep_alive / 2
