"""The server path against the offline pipeline on the GPU engine benchmark's workload (issue 6's GPU check).

``python -m benchmarks.server_gpu [--requests 300] [--out DIR]`` on a CUDA machine. A seeded subset of
``benchmarks.engine_gpu``'s 1,000 requests (prompts uniform 128-2,048, outputs uniform 64-512, the same token
ids) runs twice, each in a fresh process with the same engine config and random-weight Llama-2-7B (bf16):
1. offline: ``LLM.generate`` on all of them at once;
2. server: ``splitfuse serve`` (the click command itself, in a child process) driven over HTTP by ``splitfuse
   bench``'s closed-loop client (``engine.server.bench.run_workload``, streaming ``/v1/completions``) with one
   client per request, so every request is in flight from the start, as in the offline run. The clients are
   spread over ``--client-procs`` processes (default 4) that start together: one Python process parsing ~2,500
   SSE events a second can itself lag the server, as a load generator must not.
Throughput is requests (and output tokens) per wall second: offline around ``generate``; server from the
first request sent to the last token received. Both legs first run a whole untimed workload of the same kind. Prints a
table last and writes ``server_gpu_<card>.json``. ``--device cpu --model tiny-llama --shrink 16`` runs the
same plumbing on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks.common import ROOT, run_metadata, write_results

SELF = [sys.executable, "-m", "benchmarks.server_gpu"]  # this script in a child process (run from ROOT)


def requests(n: int, seed: int, shrink: int, part: int = 0) -> list[tuple[list[int], int]]:
    """``n`` of engine_gpu's requests, chosen by a seeded permutation; ``part`` 1 gives the next ``n`` (the
    warm-up set: same distribution, no shared prompt, so no prefix-cache hit on the timed set)."""
    from benchmarks.engine_gpu import workload

    reqs = workload(1000)
    pick = np.random.default_rng(seed).permutation(len(reqs))[part * n:(part + 1) * n]
    if shrink == 1:
        return [reqs[i] for i in pick]
    # smoke runs on a tiny model: shorter, and ids folded into a small vocabulary
    return [([3 + t % 250 for t in reqs[i][0][:max(8, len(reqs[i][0]) // shrink)]], max(4, reqs[i][1] // shrink))
            for i in pick]


def warmup(a) -> list[tuple[list[int], int]]:
    """A whole workload of the same distribution, not timed, before the timed one in both legs: a fresh machine
    has no Triton cache, and each new pass shape compiles kernel variants (a first offline leg ran 43 s instead
    of 27.5 s with only a few short warm-up requests)."""
    return requests(a.requests, a.seed, a.shrink, part=1)


def engine_kwargs(a) -> dict:
    return dict(dtype="bfloat16" if a.device == "cuda" else "float32", device=a.device,
                max_num_batched_tokens=a.token_budget, max_num_seqs=a.max_num_seqs, seed=1234)


def run_offline(a) -> dict:
    """Child process: LLM.generate on the workload, timed after a warm-up."""
    from engine import SamplingParams
    from engine.llm import LLM

    reqs = requests(a.requests, a.seed, a.shrink)
    llm = LLM(a.model, **{**engine_kwargs(a), "max_num_seqs": a.max_num_seqs or 256})
    if not a.max_num_seqs:  # engine_gpu's rule on this card's KV cache; the server then gets the same number
        from benchmarks.engine_gpu import fits_seqs, workload
        llm.engine.set_max_num_seqs(fits_seqs(llm.engine, workload(1000)))
    params = lambda n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)  # noqa: E731
    warm = warmup(a)
    llm.generate([p for p, _ in warm], [params(o) for _, o in warm])
    sizes = []
    llm.engine.scheduler.observe(lambda plan: sizes.append(plan.num_tokens))  # the timed run's passes
    t0 = time.perf_counter()
    outs = llm.generate([p for p, _ in reqs], [params(o) for _, o in reqs])
    wall = time.perf_counter() - t0
    assert all(len(o.outputs[0].token_ids) == n for o, (_, n) in zip(outs, reqs)), "an offline request fell short"
    return {"wall_s": wall, "passes": len(sizes), "mean_tokens_per_pass": float(np.mean(sizes)),
            "preemptions": llm.engine.stats().num_preemptions,
            "max_num_seqs": llm.engine.scheduler.max_num_seqs, "kv_blocks": llm.engine.num_kv_blocks}


def serve_child(a) -> None:
    """Child process: ``splitfuse serve`` with the benchmark's engine config."""
    from engine.server.cli import serve

    process_flag = "--engine-process" if a.engine_process else "--no-engine-process"
    serve.main([a.model, process_flag, "--port", str(a.port), "--max-num-batched-tokens", str(a.token_budget),
                "--max-num-seqs", str(a.max_num_seqs), "--device", a.device, "--dtype", engine_kwargs(a)["dtype"],
                "--seed", "1234"],
               standalone_mode=True)


def client_share(url: str, model: str, batch, t_start: float) -> list:
    """One client process: its share of the requests, each from its own connection, all sent at ``t_start``."""
    from sim.bench import run_workload

    table = SimpleNamespace(prompt_tokens=[len(p) for p, _ in batch], output_tokens=[o for _, o in batch],
                            arrivals=None)
    time.sleep(max(0.0, t_start - time.perf_counter()))
    return asyncio.run(run_workload(url, model, table, [p for p, _ in batch], len(batch), 1800, t0=t_start,
                                    ids=range(len(batch))))


def run_server(a) -> dict:
    import httpx

    from sim.bench import scrape, server_delta, to_result
    from sim.metrics import summarize

    cmd = [*SELF, "serve", *forwarded(a)]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    url = f"http://127.0.0.1:{a.port}"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the server did not come up in 600 s")
            time.sleep(1)
        reqs = requests(a.requests, a.seed, a.shrink)
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]

        def drive(batch, procs=1):
            """Every request in flight at once, from ``procs`` client processes sharing one clock."""
            t_start = time.perf_counter() + 0.5
            shares = [batch[i::procs] for i in range(procs)]
            with multiprocessing.get_context("fork").Pool(procs) as pool:
                parts = pool.starmap(client_share, [(url, model, share, t_start) for share in shares])
            records = [None] * len(batch)
            for i, part in enumerate(parts):
                for j, r in enumerate(part):
                    r.id = i + j * procs
                    records[r.id] = r
            return records

        drive(warmup(a), a.client_procs)
        before = scrape(url)
        t0 = time.perf_counter()
        records = drive(reqs, a.client_procs)
        wall = time.perf_counter() - t0
        stats = server_delta(before, scrape(url))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    failed = [r for r in records if r.error is not None]
    short = [r.id for r in records if r.error is None and r.output_tokens != r.max_tokens]
    span = max(r.chunk_times[-1] for r in records if r.chunk_times) - min(r.arrival for r in records)
    summary = summarize(to_result(records, a.seed, stats))
    return {"wall_s": wall, "span_s": span, "failed": len(failed), "short": short,
            "errors": [r.error for r in failed[:3]], "server": stats,
            "summary": {k: v for k, v in summary.items() if isinstance(v, (int, float))}}


def forwarded(a) -> list[str]:
    return ["--model", a.model, "--device", a.device, "--requests", str(a.requests), "--seed", str(a.seed),
            "--shrink", str(a.shrink), "--max-num-batched-tokens", str(a.token_budget),
            "--max-num-seqs", str(a.max_num_seqs),
            "--port", str(a.port), "--client-procs", str(a.client_procs),
            *([] if a.engine_process else ["--no-engine-process"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", nargs="?", default="main", choices=["main", "offline", "serve"])
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="an existing folder, or the file to write (default: $OUT, else benchmarks/results/)")
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--shrink", type=int, default=1, help="divide prompt and output lengths (CPU smoke runs)")
    ap.add_argument("--max-num-batched-tokens", "--token-budget", dest="token_budget", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=0, help="0: as engine_gpu chooses (fits_seqs)")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--no-engine-process", dest="engine_process", action="store_false",
                    help="serve with the engine in a thread of the API process (the old path), for comparison")
    ap.add_argument("--client-procs", type=int, default=4,
                    help="client processes sharing the streaming clients (one Python process can lag the server)")
    ap.add_argument("--result", default=None, help="offline role: where to write its JSON")
    a = ap.parse_args()
    if a.role == "offline":
        Path(a.result).write_text(json.dumps(run_offline(a)))
        return
    if a.role == "serve":
        serve_child(a)
        return
    reqs = requests(a.requests, a.seed, a.shrink)
    n_out = sum(o for _, o in reqs)
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "offline.json"
        subprocess.run([*SELF, "offline", "--result", str(result), *forwarded(a)], cwd=ROOT, check=True)
        offline = json.loads(result.read_text())
    a.max_num_seqs = offline["max_num_seqs"]
    server = run_server(a)
    res = {"config": {k: v for k, v in vars(a).items() if k not in ("role", "out", "result")},
           "prompt_tokens": sum(len(p) for p, _ in reqs), "output_tokens": n_out, "offline": offline,
           "server_run": server}
    for k, seconds in (("offline", offline["wall_s"]), ("server", server["span_s"])):
        res[f"{k}_req_per_s"] = a.requests / seconds
        res[f"{k}_out_tok_per_s"] = n_out / seconds
    res["ratio"] = res["server_req_per_s"] / res["offline_req_per_s"]
    card = None if a.device == "cuda" else a.device  # a CPU smoke run is not the GPU's result
    path = write_results(a.out, "server_gpu", res, card=card)
    print(f"wrote {path}")
    print(f"\n{card or run_metadata()['card']} | {a.requests} requests ({res['prompt_tokens']} prompt, {n_out} output "
          f"tokens) | budget {a.token_budget}, max_num_seqs {a.max_num_seqs}")
    print(f"offline LLM.generate : {offline['wall_s']:.1f} s, {res['offline_req_per_s']:.2f} req/s, "
          f"{res['offline_out_tok_per_s']:.0f} out tok/s, preemptions {offline['preemptions']}, "
          f"{offline['passes']} passes of {offline['mean_tokens_per_pass']:.0f} tokens")
    print(f"server (HTTP, {a.requests} clients in {a.client_procs} processes): {server['span_s']:.1f} s, "
          f"{res['server_req_per_s']:.2f} req/s, "
          f"{res['server_out_tok_per_s']:.0f} out tok/s, failed {server['failed']}, short {len(server['short'])}, "
          f"server stats {server['server']}")
    print(f"server / offline = {res['ratio']:.1%} (target >= 90%): {'met' if res['ratio'] >= 0.9 else 'MISSED'}")


if __name__ == "__main__":
    main()
