"""The server under abuse, on the CPU: slow and idle connections and a 10 MB prompt while normal streams run.

``splitfuse serve tiny-llama --device cpu`` (default limits) is started as its own process; then, at once:

- ``--idle`` connections that send nothing and ``--slow`` ones that send a request head a byte every 0.5 s
  (slowloris); each one the server closes is opened again, so the pressure lasts the whole run;
- one ``--big-mb`` MB prompt (text; ``--token-ids`` sends it as a list of token ids instead), repeated until the
  streams end;
- ``--streams`` normal streaming completions of ``--max-tokens`` tokens each;
- a probe of ``GET /health`` every 20 ms on a connection of its own.

It prints a table (the /health latency percentiles and maximum in ms, how many probes took over 100 ms, the
streams that completed with ``[DONE]``, the big prompts' answers, connections the server closed) and writes
``benchmarks/results/server_abuse_cpu.json``. The target: every /health answer within 100 ms and every stream
complete.

    python -m benchmarks.server_abuse                     # 300 connections, 10 MB, 50 streams
    python -m benchmarks.server_abuse --token-ids         # the 10 MB prompt as token ids
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import time

import httpx
import numpy as np

MODEL = "tiny-llama"
HEALTH_TARGET_MS = 100.0


def start_server(port: int, *flags: str, timeout: float = 120.0) -> subprocess.Popen:
    """``splitfuse serve`` on ``port`` (tiny model, CPU); returns once /health answers."""
    cmd = [sys.executable, "-m", "engine.server.cli", MODEL, "--port", str(port), "--device", "cpu",
           "--num-kv-blocks", "2048", "--threads", "1", *flags]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} while starting")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.2)


async def hold_connections(host: str, port: int, n: int, slow: bool, stop: asyncio.Event, closed: list) -> None:
    """``n`` connections kept open (re-opened when the server closes one); ``slow`` ones trickle a request head."""
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + b"x-pad: " + b"a" * 200

    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                i = 0
                while not stop.is_set():
                    if slow:
                        writer.write(head[i % len(head):i % len(head) + 1])
                        i += 1
                    try:
                        if await asyncio.wait_for(reader.read(4096), 0.5) == b"":
                            closed.append(1)
                            break
                    except asyncio.TimeoutError:
                        continue
            except OSError:
                closed.append(1)
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(n)))


def probe_health(url: str, stop, out) -> None:
    """In a process of its own (the load's event loop would delay the probe's own reads): GET /health every
    20 ms until ``stop`` is set; sends the latencies in ms (inf for a failed probe) to ``out``."""
    latencies = []
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = client.get(url + "/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append((time.perf_counter() - t0) * 1e3 if ok else float("inf"))
            time.sleep(0.02)
    out.send(latencies)


async def normal_stream(client: httpx.AsyncClient, url: str, i: int, max_tokens: int) -> tuple[bool, int]:
    body = {"model": MODEL, "prompt": f"Request {i}: tell me a story about the number {i}.", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "temperature": 0.8, "seed": i}
    tokens, done = 0, False
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return False, 0
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                tokens += len(json.loads(line[6:])["choices"][0]["token_ids"])
    return done, tokens


async def big_prompts(url: str, megabytes: float, token_ids: bool, stop: asyncio.Event, answers: list) -> None:
    n = int(megabytes * 1e6)
    prompt = [5] * (n // 3) if token_ids else ("lorem ipsum " * (n // 12 + 1))[:n]
    raw = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()
    async with httpx.AsyncClient(timeout=120) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = await client.post(url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
            answers.append((r.status_code, time.perf_counter() - t0, r.json().get("error", {}).get("param")))


async def run_abuse(url: str, idle: int = 150, slow: int = 150, streams: int = 50, max_tokens: int = 64,
                    big_mb: float = 10.0, token_ids: bool = False, min_seconds: float = 10.0) -> dict:
    """The abuse scenario against the server at ``url`` (the connections and big prompts keep coming until the
    streams are done and ``min_seconds`` have passed); a summary dict."""
    host, port = url.removeprefix("http://").split(":")
    stop, closed, answers = asyncio.Event(), [], []
    ctx = multiprocessing.get_context("spawn")
    probe_stop, (receive, send) = ctx.Event(), ctx.Pipe(duplex=False)
    prober = ctx.Process(target=probe_health, args=(url, probe_stop, send), daemon=True)
    prober.start()
    background = [asyncio.create_task(hold_connections(host, int(port), idle, False, stop, closed)),
                  asyncio.create_task(hold_connections(host, int(port), slow, True, stop, closed))]
    await asyncio.sleep(1.0)  # the connections are open before the load starts
    if big_mb > 0:
        background.append(asyncio.create_task(big_prompts(url, big_mb, token_ids, stop, answers)))
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=streams + 10)) as client:
        results = await asyncio.gather(*(normal_stream(client, url, i, max_tokens) for i in range(streams)))
    wall = time.perf_counter() - t0
    while (big_mb > 0 and not answers) or time.perf_counter() - t0 < min_seconds:  # a big prompt answered too
        await asyncio.sleep(0.05)
    stop.set()
    probe_stop.set()
    await asyncio.gather(*background)
    lat = np.array(await asyncio.to_thread(receive.recv))
    prober.join(10)
    return {"idle_connections": idle, "slow_connections": slow, "streams": streams, "max_tokens": max_tokens,
            "run_s": time.perf_counter() - t0,
            "big_prompt_mb": big_mb, "big_prompt_kind": "token ids" if token_ids else "text",
            "health_probes": len(lat), "health_p50_ms": float(np.percentile(lat, 50)),
            "health_p99_ms": float(np.percentile(lat, 99)), "health_max_ms": float(lat.max()),
            "health_over_100ms": int((lat > HEALTH_TARGET_MS).sum()),
            "streams_completed": sum(done and n == max_tokens for done, n in results), "streams_wall_s": wall,
            "big_prompts_answered": len(answers), "big_prompt_statuses": sorted({a[0] for a in answers}),
            "big_prompt_mean_s": float(np.mean([a[1] for a in answers])) if answers else 0.0,
            "connections_closed_by_server": len(closed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="A running server (default: start one here).")
    parser.add_argument("--idle", type=int, default=150)
    parser.add_argument("--slow", type=int, default=150)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--big-mb", type=float, default=10.0)
    parser.add_argument("--token-ids", action="store_true")
    parser.add_argument("--min-seconds", type=float, default=10.0,
                        help="Keep the connections and big prompts coming at least this long.")
    parser.add_argument("--out", default=None, help="Result file or folder (default: benchmarks/results/).")
    args = parser.parse_args()
    from benchmarks.common import write_results
    from engine.server.router import free_port

    proc = None
    url = args.url
    if url is None:
        port = free_port()
        proc = start_server(port)
        url = f"http://127.0.0.1:{port}"
    try:
        summary = asyncio.run(run_abuse(url, args.idle, args.slow, args.streams, args.max_tokens, args.big_mb,
                                        args.token_ids, args.min_seconds))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    width = max(map(len, summary))
    print(f"server abuse on the CPU ({os.cpu_count()} cores), {MODEL}, default limits")
    for key, value in summary.items():
        print(f"  {key:<{width}}  {value:.1f}" if isinstance(value, float) else f"  {key:<{width}}  {value}")
    ok = summary["health_max_ms"] <= HEALTH_TARGET_MS and summary["streams_completed"] == summary["streams"]
    print(f"target (/health <= {HEALTH_TARGET_MS:.0f} ms throughout, every stream complete): "
          f"{'met' if ok else 'MISSED'}")
    tag = "server_abuse_ids" if args.token_ids else "server_abuse"
    print("wrote", write_results(args.out, tag, summary, card="cpu", target_met=ok))


if __name__ == "__main__":
    main()
