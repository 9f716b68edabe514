"""The engine runs in its own process (``--engine-process``, the default): a different pid from the API
process, gone when the API process dies (even by SIGKILL); its death answers 503 rather than hanging, and
``splitfuse serve`` then exits with code 1 so that a supervisor restarts it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import psutil
from serving import metric, serve_in_thread, start_cli

from engine.server.app import create_app
from engine.server.engine_core import EngineSpec

MODEL = "tiny-llama"
BODY = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting for its new parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    return start_cli("--num-kv-blocks", "64", *flags)


def engine_pid_of(pid: int) -> int:
    """The engine process: the server's child that runs the engine (not multiprocessing's resource tracker)."""
    children = [c for c in psutil.Process(pid).children() if "resource_tracker" not in " ".join(c.cmdline())]
    assert len(children) == 1, children
    return children[0].pid


def test_engine_process_is_separate_and_dies_with_the_api_process():
    # vLLM's engine flags reach the engine process (the last two have no effect on the CPU but are accepted)
    proc, url = start_server("--max-model-len", "100", "--enforce-eager", "--gpu-memory-utilization", "0.5")
    try:
        assert httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"] == 100
        r = httpx.post(url + "/v1/completions", json={**BODY, "max_tokens": 98})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        engine_pid = engine_pid_of(proc.pid)
        assert engine_pid != proc.pid and parent_of(engine_pid) == proc.pid
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 4

        proc.send_signal(signal.SIGKILL)  # no clean-up code runs in the API process
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not gone(engine_pid):
            assert time.monotonic() < deadline, "the engine process outlived its API process"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_engine_process_death_answers_503_then_stops_the_server():
    app = create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=64, seed=0)), MODEL)
    with serve_in_thread(app) as url:
        assert httpx.post(url + "/v1/completions", json=BODY, timeout=30).status_code == 200
        engine_pid = app.state.server.loop.info["pid"]
        assert engine_pid != os.getpid()
        os.kill(engine_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while True:  # 503 while it stops, then no server at all: never a hang, never a 200
            assert time.monotonic() < deadline, "the server still serves after its engine died"
            try:
                r = httpx.post(url + "/v1/completions", json=BODY, timeout=10)
            except httpx.ConnectError:
                break
            except (httpx.RemoteProtocolError, httpx.ReadError):  # it stopped while this request was on its way
                time.sleep(0.05)
                continue
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
            time.sleep(0.05)


def test_in_thread_engine_still_serves():
    """``--no-engine-process``: the engine stepped in a worker thread of the API process (the old path)."""
    from engine.llm import LLMEngine

    engine = LLMEngine(MODEL, device="cpu", num_kv_blocks=64, seed=0)
    with serve_in_thread(create_app(engine, MODEL)) as url:
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 4
        assert not engine.has_unfinished() and engine.stats().num_free_blocks == 64
        assert metric(url, "splitfuse_engine_busy_seconds_total") > 0


def test_server_exits_nonzero_when_its_engine_dies_and_ends_streams_with_an_error():
    proc, url = start_server()
    try:
        events = []
        body = {**BODY, "max_tokens": 1000, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 3:
                        os.kill(engine_pid_of(proc.pid), signal.SIGKILL)
        assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
        assert '"finish_reason": "abort"' in events[-3]
        assert proc.wait(timeout=20) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
