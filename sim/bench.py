"""``splitfuse bench``: drive any OpenAI-compatible server and report latency and throughput exactly as
``splitfuse simulate`` does (the simulator's ``sim.metrics.summarize`` on the same columns), so measured and
simulated runs line up in one table.

The flags are ``vllm bench serve``'s (``--request-rate``, default inf: every request at once; ``--burstiness``;
``--max-concurrency``; ``--num-prompts``; ``--dataset-name random`` with ``--random-input-len``,
``--random-output-len``, ``--random-range-ratio``; ``--goodput ttft:200 tpot:50`` in ms; ``--save-result``
writes vLLM's JSON result, ``sim.bench_result``), with the earlier names kept as aliases. Workloads are the
simulator's (``sim.workload``): open loop with Poisson or gamma arrivals, or closed loop with N clients (as
DeepSpeed-FastGen's benchmark; an infinite rate with ``--max-concurrency N`` is the same), lengths as in
``--prompt-len``. Each request streams from ``/v1/completions`` with ``ignore_eos`` so it produces exactly its
output length, at the server's default temperature unless ``--temperature`` is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

import numpy as np

from engine.server.config import CLIENT_KEEPALIVE_EXPIRY_S, stale_connection
from sim.request_log import RequestLog


@dataclass
class Record:
    """One request as the client saw it; times are seconds since the benchmark started."""

    id: int
    prompt_tokens: int
    max_tokens: int
    arrival: float = float("nan")
    chunk_times: list[float] = field(default_factory=list)  # one per streamed event that carried tokens
    output_tokens: int = 0
    error: str | None = None
    response_id: str | None = None  # the server's id of the completion


def make_prompts(rng: np.random.Generator, lengths: np.ndarray, vocab_size: int | None) -> list:
    """Random token-id prompts of the given lengths (ids 3.. to skip BOS/EOS), or word prompts without a vocab."""
    if vocab_size:
        return [rng.integers(3, vocab_size, size=int(n)).tolist() for n in lengths]
    words = np.array(["alpha", "beta", "gamma", "delta", "echo", "fox", "golf", "hotel"])
    return [" ".join(rng.choice(words, size=int(n))) for n in lengths]


async def send(client, url: str, model: str, prompt, record: Record, t0: float, extra_body: dict | None = None
               ) -> None:
    """Stream one completion and record its times. ``extra_body``: more fields of the request (e.g. its
    ``temperature``; the server's defaults otherwise). A request whose kept-alive connection closes before any
    answer (``stale_connection``) is sent once more, on another connection; its times keep the first start."""
    body = {"model": model, "prompt": prompt, "max_tokens": record.max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **(extra_body or {})}
    record.arrival = time.perf_counter() - t0
    for last_try in (False, True):
        answered = False
        try:
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                answered = True
                usage_tokens = await _read_stream(r, record, t0)
            break
        except Exception as e:  # a transport failure is a failed request, reported, not a crash of the benchmark
            if last_try or answered or not stale_connection(e):
                record.error = repr(e)
                return
    if record.error is not None:
        return
    if usage_tokens is not None:
        record.output_tokens = usage_tokens
    if not record.chunk_times:
        record.error = "no tokens received"


async def _read_stream(r, record: Record, t0: float) -> int | None:
    """Record the token times of a streamed answer ``r``; the completion tokens its usage names (None without one).
    An HTTP error or an error event sets ``record.error``."""
    if r.status_code != 200:
        record.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
        return None
    usage_tokens = None
    async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        now = time.perf_counter() - t0
        event = json.loads(line[6:])
        if record.response_id is None:
            record.response_id = event.get("id")
        if "error" in event:
            record.error = event["error"].get("message", str(event))
            return None
        if event.get("usage"):
            usage_tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", []):
            n = len(choice["token_ids"]) if "token_ids" in choice else int(bool(choice.get("text")))
            if n:
                record.chunk_times.append(now)
                record.output_tokens += n
    return usage_tokens


async def warm_up(client, url: str) -> None:
    """One ``GET /v1/models`` before the clock starts, its answer ignored. Without it a fresh client process's first
    request pays the start-up of its HTTP stack and connection, counted as the server's admission
    (``calibration/VALIDATION.md``, tenth round)."""
    import httpx

    with contextlib.suppress(httpx.HTTPError):
        await client.get(url + "/v1/models")


async def run_workload(url: str, model: str, table, prompts: list, clients: int, timeout: float,
                       t0: float | None = None, ids=None, max_concurrency: int | None = None,
                       progress: bool = False, extra_body: dict | None = None, claimed=None,
                       cap: SharedCap | None = None) -> list[Record]:
    """Send every request (open or closed loop); times are seconds since ``t0`` (a ``time.perf_counter`` value,
    system-wide on Linux, so client processes started together can share it; default: now). ``ids``: send only
    these rows of ``table`` (one client process's share). ``max_concurrency``: in open loop, at most this many
    requests in flight (a request due while the limit is reached waits, and its latencies start when it is
    sent, as in vLLM); ``cap``: that limit shared with other client processes (``SharedCap``), which then
    replaces this process's own. ``claimed``: in closed loop, a counter of the rows taken that client processes share
    (``multiprocessing.Value``): each client takes the next row of the whole table when its last request
    finishes, not of its process's share, and ``ids`` is ignored. ``progress``: a tqdm bar of finished requests
    on stderr. ``extra_body``: fields added to every request (``send``). The client is warmed up (``warm_up``)
    before the first request."""
    import httpx
    from tqdm import tqdm

    shared = claimed is not None and table.arrivals is None
    ids = () if shared else range(len(table)) if ids is None else ids
    records = {i: _record(table, i) for i in ids}
    limits = httpx.Limits(max_connections=max(clients, max_concurrency or 0, 1) + 1024,
                          keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S)
    bar = tqdm(total=None if shared else len(records), desc="requests", unit="req", disable=not progress,
               mininterval=1.0)

    async def one(client, i: int) -> None:
        records.setdefault(i, _record(table, i))
        await send(client, url, model, prompts[i], records[i], t0, extra_body)
        bar.update(1)

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10), limits=limits) as client:
        await warm_up(client, url)
        t0 = time.perf_counter() if t0 is None else t0
        if table.arrivals is not None and cap is not None:  # open loop under a cap every client process shares
            await _send_capped(cap, table, t0, records, lambda i: one(client, i))
        elif table.arrivals is not None:  # open loop: send at the scheduled times, whatever the server does
            gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

            async def at(i: int) -> None:
                await asyncio.sleep(max(0.0, t0 + float(table.arrivals[i]) - time.perf_counter()))
                async with gate:
                    await one(client, i)

            await asyncio.gather(*(at(i) for i in records))
        else:  # closed loop: each client sends its next request when the last one finishes
            await asyncio.sleep(max(0.0, t0 - time.perf_counter()))  # every process's clients start together
            next_id = iter(records)
            take = (lambda: _claim(claimed, len(table))) if shared else (lambda: next(next_id, None))

            async def worker() -> None:
                while (i := take()) is not None:
                    await one(client, i)

            await asyncio.gather(*(worker() for _ in range(clients)))
    bar.close()
    return list(records.values())


async def _send_capped(cap: SharedCap, table, t0: float, rows, one) -> None:
    """Send ``rows`` (ascending: in arrival order) at their times, each once ``cap`` lets it go (``cap.enter``
    blocks, so it waits in a thread)."""
    loop = asyncio.get_running_loop()

    async def one_then_leave(i: int) -> None:
        try:
            await one(i)
        finally:
            cap.leave()

    sending = []
    try:
        for i in rows:
            await asyncio.sleep(max(0.0, t0 + float(table.arrivals[i]) - time.perf_counter()))
            await loop.run_in_executor(None, cap.enter, i)
            sending.append(asyncio.create_task(one_then_leave(i)))
        await asyncio.gather(*sending)
    except BaseException:
        cap.abort()  # the other processes' rows wait for this one's: let them fail instead of hanging
        raise


class SharedCap:
    """vLLM's ``--max-concurrency`` over several client processes: the rows of an open loop (in arrival order) are
    sent in that order, each once fewer than ``limit`` requests are in flight over every process, as one
    process's FIFO semaphore sends them. ``enter`` blocks."""

    def __init__(self, limit: int, context) -> None:
        self.limit = limit
        self._changed = context.Condition()
        self._state = context.RawArray("q", 3)  # the next row to send, requests in flight, aborted

    def enter(self, row: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._state[2] or (self._state[0] == row and self._state[1] < self.limit))
            if self._state[2]:
                raise RuntimeError("another client process failed; its rows were never sent")
            self._state[0] += 1
            self._state[1] += 1
            self._changed.notify_all()

    def leave(self) -> None:
        with self._changed:
            self._state[1] -= 1
            self._changed.notify_all()

    def abort(self) -> None:
        with self._changed:
            self._state[2] = 1
            self._changed.notify_all()


def _record(table, i: int) -> Record:
    return Record(i, int(table.prompt_tokens[i]), int(table.output_tokens[i]))


def _claim(claimed, rows: int) -> int | None:
    """The next row no client has taken (``claimed``: a shared counter), or None when every row is taken."""
    with claimed.get_lock():
        i = claimed.value
        if i >= rows:
            return None
        claimed.value = i + 1
        return i


def run_spread(url: str, model: str, table, prompts: list, clients: int, timeout: float,
               processes: int = 1, t0: float | None = None, max_concurrency: int | None = None,
               progress: bool = False, extra_body: dict | None = None) -> list[Record]:
    """``run_workload`` spread over ``processes`` client processes that share one clock origin ``t0`` (default:
    0.2 s from now, so every process is up before the first arrival): one Python process parsing thousands of
    streamed events a second lags the server it measures. In open loop process p sends rows p, p + processes,
    ..., and ``max_concurrency`` caps the requests in flight over every process (``SharedCap``; split into a share
    each, a process at its share would hold back requests that another had room for); in closed loop it runs its
    share of the ``clients``, which take rows from one queue, as the simulator's clients do (with a fixed share
    each, a process whose requests ran longer would finish last, alone, and lower the measured throughput by
    several percent). Records come back in row order; the first process shows the progress bar (of its share)."""
    t0 = time.perf_counter() + 0.2 if t0 is None else t0
    if table.arrivals is None:  # closed loop: every process runs one client at least
        processes = min(processes, clients)
    if processes <= 1:
        return asyncio.run(run_workload(url, model, table, prompts, clients, timeout, t0, None, max_concurrency,
                                        progress, extra_body))
    import multiprocessing

    def share(total: int, p: int) -> int:
        return total // processes + (p < total % processes)

    context = multiprocessing.get_context("fork")
    closed = table.arrivals is None
    claimed = context.Value("q", 0) if closed else None
    cap = SharedCap(max_concurrency, context) if max_concurrency and not closed else None
    shares = [(url, model, table, prompts, share(clients, p), timeout, t0, range(p, len(table), processes),
               max_concurrency, progress and p == 0, extra_body) for p in range(min(processes, len(table)))]
    with context.Pool(len(shares), initializer=_share, initargs=(claimed, cap)) as pool:
        parts = pool.starmap(_run_share, shares)
    return sorted((r for part in parts for r in part), key=lambda r: r.id)


_shared = {}  # in a client process: the closed loop's counter of rows taken and the open loop's cap (``_share``)


def _share(claimed, cap: SharedCap | None) -> None:
    _shared.update(claimed=claimed, cap=cap)


def _run_share(*args) -> list[Record]:
    return asyncio.run(run_workload(*args, **_shared))


@dataclass
class MeasuredRun:
    """Requests measured at the client, in the simulator's columns (``RequestLog``), so that
    ``sim.metrics.summarize`` judges them exactly as it judges a ``SimResult``. ``replica_rows``: the server's
    counters (preemptions, passes, tokens per pass) where it reports them."""

    columns: dict
    log: RequestLog
    replica_rows: list[dict]
    seed: int

    @property
    def requests(self):
        import pandas as pd

        return pd.DataFrame(self.columns)


def to_result(records: list[Record], seed: int, server_stats: dict | None = None) -> MeasuredRun:
    """The completed requests as the simulator records its own. A client does not see when a request was first
    scheduled, nor its preemptions or cached tokens: queue delay is NaN and those columns are left out."""
    log = RequestLog()
    for r in records:
        if r.error is None:
            log.add(r.id, 0, r.arrival, None, r.chunk_times[0], r.chunk_times[-1], r.prompt_tokens, r.output_tokens,
                    0, 0, r.chunk_times)
    columns = log.to_columns()
    del columns["preemptions"], columns["cached_tokens"]
    s = server_stats or {}
    replica = {"preemptions": s.get("preemptions", 0), "busy_share": np.nan,
               "mean_tokens_per_pass": s.get("mean_tokens_per_pass", np.nan), "passes": s.get("passes", 0)}
    return MeasuredRun(columns, log, [replica], seed)


def scrape(url: str) -> dict:
    """Preemptions and tokens-per-pass totals from a splitfuse server's /metrics (empty for other servers)."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("splitfuse_preemptions_total", "splitfuse_tokens_per_pass_sum", "splitfuse_tokens_per_pass_count",
                    "splitfuse_engine_busy_seconds_total"):
            values[name] = float(value)
    return values


def server_delta(before: dict, after: dict) -> dict:
    if not after:
        return {}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    passes = d.get("splitfuse_tokens_per_pass_count", 0)
    return {"preemptions": int(d.get("splitfuse_preemptions_total", 0)), "passes": int(passes),
            "mean_tokens_per_pass": d.get("splitfuse_tokens_per_pass_sum", 0) / passes if passes else np.nan,
            "engine_busy_s": d.get("splitfuse_engine_busy_seconds_total", np.nan)}


