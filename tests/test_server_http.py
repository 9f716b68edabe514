"""The HTTP side of ``splitfuse serve`` as vLLM and uvicorn name it: ``--api-key`` (and ``VLLM_API_KEY``), CORS,
``--disable-fastapi-docs``, the slow-header and keep-alive deadline (``--timeout-keep-alive``), the connection
limit (``--limit-concurrency``), and a graceful stop on SIGTERM (``--shutdown-timeout``)."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import pytest
from serving import serve_in_thread, start_cli

from engine.server.app import create_app
from engine.server.config import ServerConfig
from engine.server.engine_core import EngineSpec

MODEL = "tiny-llama"
KEY = "sk-test"
BODY = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}
CONFIG = ServerConfig(api_key=KEY, allowed_origins='["https://ok.example"]', disable_fastapi_docs=True,
                      timeout_keep_alive=1.0, limit_concurrency=12)


@pytest.fixture(scope="module")
def url():
    app = create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=64, seed=0)), MODEL, config=CONFIG)
    with serve_in_thread(app, config=CONFIG) as url:
        yield url


def auth(key: str = KEY) -> dict:
    return {"authorization": f"Bearer {key}"}


def test_api_key_cors_and_docs(url):
    for headers in ({}, auth("wrong"), {"authorization": KEY}):
        r = httpx.post(url + "/v1/completions", json=BODY, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.post(url + "/v1/completions", json=BODY, headers=auth()).status_code == 200
    assert httpx.get(url + "/health").status_code == 200  # probes need no key, as in vLLM

    preflight = {"origin": "https://ok.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization,content-type"}
    r = httpx.options(url + "/v1/completions", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ok.example"
    r = httpx.options(url + "/v1/completions", headers={**preflight, "origin": "https://evil.example"})
    assert r.headers.get("access-control-allow-origin") != "https://evil.example"

    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(url + path).status_code == 404


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float:
    """Seconds until the server closes ``sock`` (sending ``trickle`` a byte every 0.2 s meanwhile)."""
    start = time.monotonic()
    sock.settimeout(0.2)
    for i in range(int(seconds / 0.2) + 1):
        if i < len(trickle):
            try:
                sock.send(trickle[i:i + 1])
            except OSError:
                return time.monotonic() - start
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    raise AssertionError(f"the server kept the connection open for {seconds} s")


def test_slow_headers_and_idle_connections_are_closed(url):
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as idle:
        assert closed_within(idle, 4.0) < 2.5  # nothing sent: closed after --timeout-keep-alive (1 s)
    with socket.create_connection((host, int(port))) as slow:
        head = f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n".encode() + b"x" * 100
        assert closed_within(slow, 4.0, trickle=head) < 2.5  # a byte every 0.2 s does not buy more time
    assert httpx.get(url + "/health").status_code == 200


def test_connection_limit_answers_503_beyond_it(url):
    host, port = url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(CONFIG.limit_concurrency + 4)]
    try:
        refused = 0
        for s in socks:
            s.settimeout(0.5)
            try:
                data = s.recv(4096)
            except TimeoutError:
                continue
            if b" 503 " in data:
                refused += 1
                assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 503
        assert refused >= 4
    finally:
        for s in socks:
            s.close()
    time.sleep(0.2)
    assert httpx.get(url + "/health").status_code == 200  # served again once they are gone


def read_stream(url: str, body: dict, headers: dict, events: list) -> None:
    """Appends (arrival time, data) of each SSE event to ``events`` as it comes."""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, headers=headers,
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append((time.monotonic(), line[6:]))


def test_sigterm_drains_then_ends_the_rest_with_abort_and_done():
    # 1 s of drain: a CPU streams a few hundred tokens a second, so the short request (100 tokens) ends within
    # it and the long ones (1000, near the context) do not; with 2 s a fast CI machine finished them.
    proc, url = start_cli("--num-kv-blocks", "256", "--shutdown-timeout", "1", env={"VLLM_API_KEY": KEY})
    try:
        assert httpx.post(url + "/v1/completions", json=BODY).status_code == 401  # the key came from the env
        long, short = [[], [], []], []
        threads = [threading.Thread(target=read_stream, args=(url, {**BODY, "max_tokens": 1000}, auth(), events))
                   for events in long]
        threads += [threading.Thread(target=read_stream, args=(url, {**BODY, "max_tokens": 100}, auth(), short))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while not short or not all(long):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        sigterm = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert short[-1][0] > sigterm, "the short request was not in flight at SIGTERM: the test proved nothing"
    assert short[-1][1] == "[DONE]" and json.loads(short[-2][1])["choices"][0]["finish_reason"] == "length"
    for events in long:
        data = [d for _, d in events]
        assert data[-1] == "[DONE]" and "shut down" in json.loads(data[-2]).get("error", {}).get("message", ""), \
            f"a long request was not cut by the shutdown after {len(data)} events: {data[-2][:200]}"
        assert json.loads(data[-3])["choices"][0]["finish_reason"] == "abort"
        assert events[-1][0] - sigterm > 0.8  # they had the shutdown timeout to finish
