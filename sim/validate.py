"""``splitfuse validate``: the simulator against the real engine behind its server, on the same seeded workloads.

For each group of cells that share a scheduler and token budget, one ``splitfuse serve`` process runs the engine
with a pass-level trace (``engine.server.engine_core.PassTrace``); a warm-up workload compiles its kernels; then each
cell's workload is sent by ``sim.bench``'s client (spread over client processes) and the server is left to go idle
before the next. Loads are shares of the *measured* saturation rate of each (scheduler, mix): an overload run's
steady throughput, while its queue is full. The same seeded workload then runs through the simulator on the card's
profile, given the KV capacity and context limit the server's engine reported.

Four views of every cell, summarized by ``sim.metrics.summarize`` alike (``source``):
- ``sim``: the simulator, tokens when its client received them;
- ``sim-server``: the same simulated run at its passes' ends, before the serving path delivered them;
- ``server``: the engine's ground truth: each request's tokens at the end of the pass that produced them (the
  trace), arrivals as the client sent them;
- ``client``: what users see: tokens when the client received them.
``errors.csv`` sets ``sim`` against ``client`` and ``sim-server`` against ``server``.
Server and client processes read one clock (``time.perf_counter``, CLOCK_MONOTONIC on Linux), so the difference
between the two views is the serving path's delivery time, and each pass's trace row sets the profile's prediction
beside what the pass took (``passes.csv``).

Writes ``validation.csv`` (one row per cell and source: cell keys, metrics), ``errors.csv`` (the simulator's
relative error against each measured view, and whether the cell is within the bounds it is judged by:
``calibration.validation_results.BOUNDS``), ``passes.csv`` (every traced pass of every cell: features, path,
measured and predicted seconds, and the pass's phases: schedule, prepare, wait, update and device time),
``delivery.csv`` (per request: server and client first-token and finish times) and ``report.html``. A grid run with
``--repeats`` sends each cell's requests that many times (fresh prompt tokens, the same lengths and arrival times)
and also writes ``errors_repeats.csv``: the simulator against the mean of the repeats, beside the repeats' own
spread (the engine against itself on the same requests). A fleet's cells also run through the simulator on the
routes its router took (the trace names each request's engine): ``routing.csv`` sets the simulator's error with its
own balancer's routes beside its error with the measured router's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from calibration.host_spread import HostSpread, MeasuredHost, scheduler_name
from calibration.serving import (
    HEAT_TAU_S,
    STEP_KNEE,
    decode_spread_tokens,
    prefill_heats,
    scale_path,
    served_noise,
)
from calibration.validation_results import CELL as CELL_KEYS
from calibration.validation_results import VIEWS, with_bounds
from engine.config import SAMPLER_DRAW, SAMPLER_DRAWS
from engine.policy import PassFeatures, PolicyConfig, scheduler_class
from engine.policy.options import config_flags
from sim.bench import MeasuredRun, Record, make_prompts, run_spread, to_result
from sim.cluster import ClusterConfig, simulate
from sim.costs import CostModel, SlowerHost, mean_noise_factor, typical_host
from sim.cpu_sets import affinity, format_cpu_list, parse_cpu_list
from sim.host_facts import host_facts
from sim.metrics import SLA, summarize
from sim.request_log import RequestLog
from sim.router import SERVE_ROUTER, RouterCost
from sim.saturation import engine_concurrency as replica_concurrency
from sim.saturation import estimate_capacity
from sim.workload import FASTGEN_MAX_PROMPT_TOKENS, MIXES, Workload, parse_length

# the grids' named mixes are sim.workload.MIXES (issue 17's); prompts clipped at 4,000 tokens, as FastGen's benchmark
MAX_PROMPT_TOKENS = FASTGEN_MAX_PROMPT_TOKENS
COMPARED = ("ttft", "tpot", "e2e", "itl")
STATS = ("mean", "p50", "p90", "p95", "p99")
# FastGen's effective throughput: requests/s x the share meeting its SLA (generation at 4 tokens/s; sim.metrics.SLA)
RATES = ("throughput_rps", "token_throughput_tps", "mean_tokens_per_pass", "preemptions", "effective_throughput_rps",
         "sla_share")
SPREAD_METRICS = ("throughput_rps", "ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90", "e2e_mean", "e2e_p90")


@dataclass(frozen=True)
class Cell:
    """One measured workload: prompt and output lengths of the ``mix`` (length specs, ``sim.workload``); ``load``
    is a share of the measured saturation rate (open loop, Poisson), or ``clients`` closed-loop clients.
    ``replicas`` engines (one GPU each) behind the router's ``balancer`` serve it; one is served directly.
    ``repeat`` numbers the runs of one cell's requests (``--repeats``); each sends prompts of tokens of its own.
    ``max_concurrency``: an open-loop cell's cap on requests in flight (``Workload.max_concurrency``; 0: none).
    ``temperature``: every request's sampling temperature (1.0, the server's default; 0 is greedy)."""

    scheduler: str
    token_budget: int
    mix: str
    prompt: str
    output: str
    num_requests: int
    load: float | None = None
    clients: int = 0
    seed: int = 0
    replicas: int = 1
    balancer: str = PolicyConfig().balancer
    repeat: int = 0
    max_concurrency: int = 0
    temperature: float = 1.0

    @property
    def arrivals(self) -> str:
        return "closed" if self.clients else "poisson"

    def workload(self, rate: float | None = None) -> Workload:
        return Workload(num_requests=self.num_requests, arrivals=self.arrivals, rate=rate, clients=self.clients,
                        max_concurrency=self.max_concurrency or None, prompt=parse_length(self.prompt),
                        output=parse_length(self.output, "--output-len"),
                        max_prompt_tokens=MAX_PROMPT_TOKENS, temperature=self.temperature)

    def keys(self) -> dict:
        return {"scheduler": self.scheduler, "token_budget": self.token_budget, "mix": self.mix,
                "arrivals": self.arrivals, "load": self.load, "clients": self.clients,
                "num_requests": self.num_requests, "seed": self.seed, "replicas": self.replicas,
                "balancer": self.balancer, "repeat": self.repeat, "max_concurrency": self.max_concurrency,
                "temperature": self.temperature}

    @property
    def policy(self) -> PolicyConfig:
        return PolicyConfig(scheduler=self.scheduler, max_num_batched_tokens=self.token_budget, balancer=self.balancer)

    @property
    def server(self) -> str:
        """The name of the server (one engine, or a fleet of them) that runs the cell."""
        name = scheduler_name(self.scheduler, self.token_budget)
        return name if self.replicas == 1 else f"{name}-x{self.replicas}"


class ServedCost:
    """A profile as the served engine runs it: the profile's pass costs, the KV blocks and context limit the
    server's engine reported (its token budget and batch bound size its cache, not the profile sweep's)."""

    def __init__(self, cost: CostModel, num_kv_blocks: int, max_model_len: int) -> None:
        self.cost, self.num_kv_blocks, self.max_model_len = cost, num_kv_blocks, max_model_len
        self.block_size, self.meta = cost.block_size, cost.meta
        self.predict, self.noise_factors = cost.predict, cost.noise_factors
        self.admission_seconds, self.delivery_seconds = cost.admission_seconds, cost.delivery_seconds
        self.attention_seconds = getattr(cost, "attention_seconds", None)
        self.greedy_seconds = getattr(cost, "greedy_seconds", None)

    def new_heat(self):
        return self.cost.new_heat() if hasattr(self.cost, "new_heat") else None


# -- the server ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``splitfuse serve`` in a child process with a pass trace, for the lifetime of a ``with`` block."""

    def __init__(self, model: str, policy: PolicyConfig, engine_options: dict, trace: Path | None, log: Path,
                 env: dict | None = None, replica_urls: tuple[str, ...] = (), start_timeout: float = 1200.0,
                 cpus: frozenset[int] | None = None) -> None:
        self.model, self.policy, self.engine_options, self.env = model, policy, engine_options, env
        self.cpus = cpus  # the CPUs the server's processes (API and engine) may run on; None: any
        self.trace, self.log, self.start_timeout, self.replica_urls = trace, log, start_timeout, replica_urls
        self.url = f"http://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen | None = None
        self.info: dict = {}

    def start(self) -> Server:
        from engine.config import EngineConfig

        flags = config_flags(PolicyConfig, vars(self.policy)) + config_flags(EngineConfig, self.engine_options)
        command = [sys.executable, "-m", "engine.server.cli", self.model, "--port", self.url.rsplit(":", 1)[1],
                   "--max-waiting", "100000", *flags]
        command += ["--pass-trace", str(self.trace)] if self.trace else []
        command += [arg for url in self.replica_urls for arg in ("--replica-url", url)]
        self._log = open(self.log, "w")
        env = {**os.environ, **self.env} if self.env else None
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        if self.cpus:  # set while the server still starts Python: its threads and engine process inherit it
            os.sched_setaffinity(self.process.pid, self.cpus)
        return self

    def __enter__(self) -> Server:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.process.returncode} while starting; see "
                                   f"{self.log}:\n{self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                health = httpx.get(self.url + "/health", timeout=2)
                if health.status_code == 200 and all(r["healthy"] for r in health.json().get("replicas", [])):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not ready after {self.start_timeout:.0f} s; see {self.log}")
            time.sleep(0.5)
        if self.replica_urls:  # a router: the model and its engines are the replicas'
            return
        model = httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]
        self.info = {"model_id": model["id"], "max_model_len": model["max_model_len"],
                     "vocab_size": model["vocab_size"], **self.stats(),
                     "cpus": format_cpu_list(os.sched_getaffinity(self.process.pid))}

    def stats(self) -> dict:
        import httpx

        return httpx.get(self.url + "/health", timeout=10).json()

    def wait_idle(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if s.get("running") == 0 and s.get("waiting") == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server is not idle after {timeout:.0f} s: {s}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # a graceful stop: the engine writes its trace
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Fleet:
    """Replica servers (one GPU each) behind a router: where a fleet's cells are sent."""

    def __init__(self, servers: list[Server], router: Server) -> None:
        self.servers, self.url, self.info = servers, router.url, servers[0].info

    def wait_idle(self, timeout: float = 600.0) -> None:
        for server in self.servers:
            server.wait_idle(timeout)


def fleet_router(model: str, cell: Cell, engine_options: dict, log: Path, urls: tuple[str, ...],
                 cpus: frozenset[int] | None = None) -> Server:
    """A router for one cell over the engines at ``urls``, its balancer seeded with the cell's seed as the simulator's
    is: a random balancer then draws the simulator's choices, which it could not after an earlier run's draws."""
    return Server(model, cell.policy, {**engine_options, "seed": cell.seed}, None, log, replica_urls=urls, cpus=cpus)


def trace_files(out: Path, server: str, replicas: int) -> list[Path]:
    """The pass trace of each engine of ``server`` (one per replica)."""
    if replicas == 1:
        return [out / f"trace-{server}.jsonl"]
    return [out / f"trace-{server}-r{i}.jsonl" for i in range(replicas)]


def read_traces(paths: list[Path]) -> tuple[list[list[dict]], dict[str, dict]]:
    """([passes in order] per engine, finished requests of all engines by id, each with the ``engine`` that served
    it) of ``PassTrace`` files."""
    passes, requests = [], {}
    for engine, path in enumerate(paths):
        passes.append([])
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.pop("kind") == "pass":
                passes[-1].append(row)
            else:
                requests[row["id"]] = {**row, "engine": engine}
    return passes, requests


def fill_decode_max_context(passes: list[list[dict]], requests: dict[str, dict], prompt_tokens: dict[str, int]) -> None:
    """Give each traced pass without ``decode_max_context`` (traces before the engine recorded it) its longest
    decode context, rebuilt from the requests' token times: the pass that made a request's token k >= 1 decoded it
    over prompt + k tokens. Left out (0: not known) where the pass's decodes are not all among ``requests`` with a
    known prompt length (``prompt_tokens``, by response id)."""
    contexts: dict[float, list[int]] = {}
    for request_id, row in requests.items():
        prompt = prompt_tokens.get(request_id)
        if prompt is not None:
            for k, t in enumerate(row["token_times"][1:], start=1):
                contexts.setdefault(t, []).append(prompt + k)
    for engine_passes in passes:
        for p in engine_passes:
            if "decode_max_context" not in p:
                found = contexts.get(p["end"], []) if p["decode_tokens"] else []
                p["decode_max_context"] = max(found) if found and len(found) == p["decode_tokens"] else 0


# -- one cell ------------------------------------------------------------------------------------------------
@dataclass
class Measured:
    """A cell as run on the server: the client's records, the run's window on the shared clock, the workload."""

    cell: Cell
    rate: float | None
    records: list[Record]
    t0: float  # the clock value of the workload's time 0
    window: tuple[float, float]  # first send, last token (clock values)


def cell_prompts(cell: Cell, lengths, vocab_size: int | None) -> list:
    """Prompts of the given lengths (the seed's) of token ids of ``cell``'s own, a repeat's too: a prompt sent again
    in a later cell would hit the engine's prefix cache, which the simulator's requests do not."""
    return make_prompts(np.random.default_rng([cell.seed, 0xB0, zlib.crc32(repr(cell).encode())]), lengths,
                        vocab_size)


def send_cell(server: Server | Fleet, cell: Cell, rate: float | None, processes: int, timeout: float) -> Measured:
    workload = cell.workload(rate)
    table = workload.generate(cell.seed)
    # The engine (and the simulated one) ends a request at the context limit; the server rejects a max_tokens past
    # it, as vLLM does, so ask for what the engine would give.
    table = dataclasses.replace(table, output_tokens=np.minimum(table.output_tokens,
                                                                server.info["max_model_len"] - table.prompt_tokens))
    prompts = cell_prompts(cell, table.prompt_tokens, server.info["vocab_size"])
    t0 = time.perf_counter() + 0.2  # the workload's time 0: every client process is up by then
    records = run_spread(server.url, server.info["model_id"], table, prompts, cell.clients, timeout, processes, t0,
                         workload.max_concurrency, extra_body={"temperature": cell.temperature})
    failed = [r for r in records if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} requests failed in {cell}: {failed[0].error}")
    end = max(t0 + r.chunk_times[-1] for r in records)
    server.wait_idle()
    return Measured(cell, rate, records, t0, (t0 + min(r.arrival for r in records), end))


def engine_concurrency(cell: Cell, info: dict) -> int:
    """How many of ``cell``'s requests its engines hold at once (``sim.saturation.engine_concurrency`` of each, with
    the KV cache the server reported)."""
    policy = cell.policy
    return cell.replicas * replica_concurrency(policy, info["kv_total_blocks"] * policy.block_size, cell.workload(1.0))


def steady_throughput(finish_times, concurrency: int) -> float:
    """Requests/s of an overload run while the engines were full: completions between the ``concurrency``-th finish
    and the ``concurrency``-th from last. Before that window the first batch is still running, after it the queue
    has drained; a scheduler that runs batches in lockstep (prefill-first) finishes a whole batch at once, which a
    window narrower than a batch would turn into a burst rate."""
    finish = np.sort(np.asarray(finish_times, dtype=float))
    if len(finish) < 3 * concurrency:
        raise ValueError(f"{len(finish)} requests cannot show a steady rate at {concurrency} at once (need "
                         f"{3 * concurrency})")
    lo, hi = finish[concurrency], finish[len(finish) - concurrency]
    return float((len(finish) - 2 * concurrency) / (hi - lo))


# Completions inside an overload run's steady window: enough that the measured rate, of which loads are shares,
# moves by a few percent from one workload seed to the next (calibration/VALIDATION.md, eighth round).
STEADY_COMPLETIONS = 200


def overload_requests(num_requests: int, concurrency: int) -> int:
    """Requests of an overload run: at least the cell's, three times the engines' concurrency (a batch to fill,
    one to measure, one to drain) and enough for ``STEADY_COMPLETIONS`` between the first and last batch."""
    return max(num_requests, 3 * concurrency, 2 * concurrency + STEADY_COMPLETIONS)


def saturation_rate(server: Server | Fleet, cell: Cell, overload_rate: float, processes: int,
                    timeout: float) -> tuple[float, Measured]:
    """Requests/s the engines sustain on ``cell``'s mix: an open-loop run at ``overload_rate`` (well above it) of
    ``overload_requests``, its ``steady_throughput``; and that run."""
    concurrency = engine_concurrency(cell, server.info)
    overload = dataclasses.replace(cell, load=None, clients=0, max_concurrency=0, seed=cell.seed + 7919,
                                   num_requests=overload_requests(cell.num_requests, concurrency))
    measured = send_cell(server, overload, overload_rate, processes, timeout)
    return steady_throughput([r.chunk_times[-1] for r in measured.records], concurrency), measured


def views(measured: Measured, trace_requests: dict[str, dict] | None) -> dict[str, object]:
    """The server's and the client's view of a measured cell as ``MeasuredRun``s (times from the workload's 0);
    the client's alone without a trace."""
    if trace_requests is None:
        return {"client": to_result(measured.records, measured.cell.seed)}
    server_records = []
    for r in measured.records:
        row = trace_requests.get(r.response_id)
        if row is None:
            raise RuntimeError(f"request {r.id} ({r.response_id}) is missing from the pass trace")
        times = [t - measured.t0 for t in row["token_times"]]
        server_records.append(Record(r.id, r.prompt_tokens, r.max_tokens, r.arrival, times, len(times),
                                     response_id=r.response_id))
    return {"server": to_result(server_records, measured.cell.seed),
            "client": to_result(measured.records, measured.cell.seed)}


def cell_passes(measured: Measured, passes: list[list[dict]], cost: CostModel | list[CostModel],
                heat_tau_s: float = HEAT_TAU_S) -> list[dict]:
    """The traced passes of each engine (``replica``) inside the cell's window, each with the profile's prediction
    (``predicted_s``; ``cost``: one for every engine or a list, ``engine_costs``) and the swept price of its prompt
    attention (``attention_s``, ``Profile.attention_seconds``; NaN for costs without one). ``pass_s`` spans what a
    profile's sweep times (schedule, run, sample, update); ``loop_s`` runs until the next step began, the serving
    loop's own work (outputs, sending, commands) included, and ``serving_s`` is that work alone: both only where the
    next step began at once (else NaN: the engine went idle). ``heat``: the card's heat when the pass began
    (``calibration.serving.prefill_heats`` over the engine's whole trace, with the cost's own time constant where it
    has a heat, else ``heat_tau_s``: that of a section being fitted on a bare profile), which the prediction takes.
    Each pass's own phases (``PHASES``, NaN where its trace lacks them): ``schedule_s`` (the plan), ``prepare_s``
    (inputs built and the pass enqueued), ``wait_s`` (until its sampled ids reached the host), ``update_s`` (the
    scheduler applying them) and ``device_s`` (the GPU's own time, where traced): what a step's excess over its
    price is made of, host or card, as its batch grows. ``discarded``: the trace marks the pass as one that threw
    away a greedy decode step enqueued ahead (False in traces that do not say).

    A pass that samples nothing (prompt chunks alone) ends without waiting for the GPU, so its work is timed in the
    next pass that samples: that pass's row spans the whole run of them (``passes`` > 1: its times from the first
    one's start, its prediction their sum) and theirs keep only ``serving_s``. In a cell sent at temperature 0 a
    graph pass that samples is predicted as the cost prices a greedy one (``greedy_seconds``), ahead or not."""
    lo, hi = measured.window
    rows = []
    costs = engine_costs(cost, len(passes))
    for replica, engine_passes in enumerate(passes):
        engine_cost = costs[replica]
        card = engine_cost.new_heat() if hasattr(engine_cost, "new_heat") else None
        attention = getattr(engine_cost, "attention_seconds", None)
        greedy = getattr(engine_cost, "greedy_seconds", None) if measured.cell.temperature == 0 else None
        heats = prefill_heats(engine_passes, card.tau_s if card is not None else heat_tau_s)
        # the passes since the last that waited for the GPU
        run_start, run_predicted, run_attention, run_passes = None, 0.0, 0.0, 0
        for i, p in enumerate(engine_passes):
            features = PassFeatures.from_mapping(p)
            predicted = engine_cost.predict(features) if card is None else engine_cost.predict(features, heats[i])
            if greedy is not None:
                seconds = greedy(features, "ahead" if p["ahead"] else "step", predicted)
                predicted = predicted if seconds is None else seconds
            attention_s = attention(features) if attention else float("nan")
            following = engine_passes[i + 1]["start"] if i + 1 < len(engine_passes) else None
            busy = following is not None and following - p["sent"] < 1e-3
            unsynced = p["num_samples"] == 0 and busy
            start = p["start"] if run_start is None else run_start
            if unsynced:
                run_start, run_predicted, run_passes = start, run_predicted + predicted, run_passes + 1
                run_attention += attention_s
            if lo <= p["start"] <= hi:
                rows.append({**measured.cell.keys(), "replica": replica, "path": p["path"], "ahead": p["ahead"],
                             "discarded": bool(p.get("discarded", False)), "num_outputs": p["num_outputs"],
                             **features._asdict(), "heat": heats[i],
                             "passes": 0 if unsynced else run_passes + 1,
                             "pass_s": float("nan") if unsynced else p["updated"] - start,
                             "loop_s": following - start if busy and not unsynced else float("nan"),
                             "serving_s": following - p["updated"] if busy else float("nan"),
                             "predicted_s": float("nan") if unsynced else predicted + run_predicted,
                             "attention_s": float("nan") if unsynced else attention_s + run_attention,
                             **pass_phases(p)})
            if not unsynced:
                run_start, run_predicted, run_attention, run_passes = None, 0.0, 0.0, 0
    return rows


# a traced pass's phases: each the time between two of its marks (``engine.llm.PassRecord``)
PHASES = {"schedule_s": ("start", "scheduled"), "prepare_s": ("scheduled", "launched"),
          "wait_s": ("launched", "sampled"), "update_s": ("sampled", "updated")}


def pass_phases(p: dict) -> dict[str, float]:
    """``PHASES`` of one traced pass and its ``device_s``, each NaN where the trace lacks it."""
    nan = float("nan")
    phases = {name: p[end] - p[begin] if begin in p and end in p else nan for name, (begin, end) in PHASES.items()}
    device = p.get("device_s")
    return {**phases, "device_s": nan if device is None else device}


def engine_costs(cost, engines: int) -> list:
    """One cost model per engine of a run: ``cost`` for each, or, given a list (one per card), its first
    ``engines``; a list of one stands for every engine."""
    if not isinstance(cost, (list, tuple)):
        return [cost] * engines
    if len(cost) == 1:
        return list(cost) * engines
    if len(cost) < engines:
        raise ValueError(f"{len(cost)} cost models for a run of {engines} engines")
    return list(cost[:engines])


def simulated(cell: Cell, rate: float | None, cost: ServedCost, seed: int | None = None,
              first_id: int = 0, server_view: bool = True,
              routes: list[int] | None = None) -> tuple[dict, dict | None, list[int]]:
    """The simulator's summary of the cell's workload (of its requests from ``first_id`` on), the same run's server
    view (``at_pass_ends``; None without ``server_view``) and its tokens per pass. ``seed`` (default the cell's)
    draws pass-time noise and serving delays; the workload is the cell's whatever the seed. A fleet's requests and
    tokens pass through the router ``splitfuse serve --replicas N`` runs (``sim.router.SERVE_ROUTER``); ``routes``
    sends each request to the replica given instead of the one the balancer picks (``sim.cluster.simulate``)."""
    tokens: list[int] = []
    pass_end: dict[float, float] = {}  # when a pass's tokens reach the client -> when the pass ended

    def on_pass(replica: int, plan, start: float, end: float, delivered: float) -> None:
        tokens.append(plan.num_tokens)
        if server_view:
            pass_end[delivered] = end

    result = simulate(cell.workload(rate), ClusterConfig(cost, cell.replicas, cell.policy, router=SERVE_ROUTER),
                      seed=cell.seed if seed is None else seed, workload_seed=cell.seed, on_pass=on_pass,
                      token_times=server_view, routes=routes)
    keep = result.columns["measured"] & (result.columns["id"] >= first_id) if first_id else None
    server = summarize(at_pass_ends(result, pass_end), SLA(), keep) if server_view else None
    return summarize(result, SLA(), keep), server, tokens


def at_pass_ends(result, pass_end: dict[float, float]) -> MeasuredRun:
    """A simulated run as the engine's trace would show it (the ``server`` view): each token at the end of the
    pass that made it, before the serving path delivered it; arrivals, as in the server view, when clients sent."""
    log = RequestLog(result.log.measured_from, result.log.measured_to)
    c = result.columns
    row = {int(i): k for k, i in enumerate(c["id"])}
    for request_id, client_times in result.log.token_times:
        try:
            times = [pass_end[t] for t in client_times.tolist()]
        except KeyError:
            raise RuntimeError(f"simulated request {request_id}: a token came at no pass's end + delivery") from None
        k = row[request_id]
        log.add(request_id, int(c["replica"][k]), float(c["arrival"][k]), float(c["scheduled"][k]), times[0],
                times[-1], int(c["prompt_tokens"][k]), int(c["output_tokens"][k]), int(c["preemptions"][k]),
                int(c["cached_tokens"][k]), times)
    return MeasuredRun(log.to_columns(), log, result.replica_rows, result.seed)


def seed_spread(cell: Cell, rate: float | None, cost: ServedCost, seeds: int, own: dict,
                first_id: int = 0) -> list[dict]:
    """The simulator's headline metrics on ``seeds`` seeds (the cell's, whose summary ``own`` is, and the next
    ones): one row per metric with their mean, standard deviation, min and max."""
    runs = [metric_columns(own)] + [metric_columns(simulated(cell, rate, cost, cell.seed + k, first_id,
                                                                               server_view=False)[0])
                                    for k in range(1, seeds)]
    rows = []
    for metric in SPREAD_METRICS:
        values = np.array([run[metric] for run in runs], dtype=float)
        rows.append({**cell.keys(), "metric": metric, "seeds": seeds, "mean": values.mean(), "std": values.std(),
                     "min": values.min(), "max": values.max()})
    return rows


def measured_routes(measured: Measured, trace_requests: dict[str, dict]) -> list[int]:
    """The engine the fleet's router sent each of the cell's requests to (by workload index), from the trace."""
    routes = {r.id: trace_requests[r.response_id]["engine"] for r in measured.records if r.response_id in
              trace_requests}
    if sorted(routes) != list(range(len(measured.records))):
        raise RuntimeError(f"the pass trace misses {len(measured.records) - len(routes)} of the cell's "
                           f"{len(measured.records)} requests: their routes are unknown")
    return [routes[i] for i in range(len(routes))]


def routing_errors(frame):
    """For a fleet's cells: the simulator's relative error against the client's view with its own balancer's routes
    (``routes`` "balancer", source "sim") and with the measured router's ("measured", "sim-routed"). What the
    first has and the second lacks is the routing's share of the error; what both have, the replicas'."""
    import pandas as pd

    metrics = [c for c in frame.columns if c not in (*CELL_KEYS, "rate", "source", "requests")]
    keyed = frame.assign(load=frame["load"].fillna(-1)).set_index(list(CELL_KEYS))
    measured = keyed[keyed.source == "client"][metrics]
    rows = []
    for source, routes in (("sim", "balancer"), ("sim-routed", "measured")):
        sim = keyed[keyed.source == source][metrics]
        error = (sim - measured.loc[sim.index]) / measured.loc[sim.index]
        rows.append(error.assign(routes=routes).reset_index())
    out = pd.concat(rows, ignore_index=True).sort_values([*CELL_KEYS, "routes"], ignore_index=True)
    out["load"] = out["load"].where(out["load"] >= 0)
    return out


def _cap(cell: Cell) -> str:
    return f" max concurrency {cell.max_concurrency}" if cell.max_concurrency else ""


def first_requests(cell: Cell, processes: int) -> int:
    """How many of a measured cell's first rows were each some client's first request: one per closed-loop client,
    else one per client process (process p sends rows p, p + processes, ...)."""
    return cell.clients if cell.clients else min(processes, cell.num_requests)


# -- the grid ------------------------------------------------------------------------------------------------
def metric_columns(summary: dict) -> dict:
    out = {f"{m}_{s}": summary.get(f"{m}_{s}", float("nan")) for m in COMPARED for s in STATS}
    out.update({k: summary.get(k, float("nan")) for k in RATES})
    out["requests"] = summary["requests"]
    return out


def measure(model: str, cells: list[Cell], out: Path, engine_options: dict, estimate: CostModel,
            warmup_requests: int = 64, client_processes: int = 4, timeout: float = 600.0, overload: float = 3.0,
            cell_seconds: float | None = None, time_budget: float | None = None,
            saturation: dict[str, dict[str, float]] | None = None, server_cpus: frozenset[int] | None = None,
            client_cpus: frozenset[int] | None = None, progress=print) -> None:
    """Run every cell on the real server; write what the client saw (``measured.jsonl``), the pass traces and
    ``meta.json`` (the run's options, saturation rates, commit and ``sim.host_facts.host_facts``) into ``out`` for
    ``compare``. ``estimate`` (a cost model of the card) sets each overload run's
    rate; ``cell_seconds`` caps an open-loop cell's requests at rate x that many seconds (at least 50); cells not
    begun within ``time_budget`` seconds are skipped (and said so), so that the servers still stop in order and
    write their traces. A fleet's loads are shares of ``replicas`` times one engine's saturation rate, measured
    in this run or given in ``saturation`` ({server name: {mix: requests/s}}, as ``meta.json`` keeps it), else
    measured on the fleet. ``server_cpus`` and ``client_cpus`` (``sim.cpu_sets``): the CPUs the servers (engines
    and router) and the clients (this process while it measures) may run on; None: any."""
    with affinity(client_cpus):
        _measure(model, cells, out, engine_options, estimate, warmup_requests, client_processes, timeout, overload,
                 cell_seconds, time_budget, saturation, server_cpus, progress)


def _measure(model, cells, out, engine_options, estimate, warmup_requests, client_processes, timeout, overload,
             cell_seconds, time_budget, saturation, server_cpus, progress) -> None:
    from engine.server.router import replica_slots

    deadline = time.monotonic() + time_budget if time_budget else float("inf")

    out.mkdir(parents=True, exist_ok=True)
    saturation = {name: dict(rates) for name, rates in (saturation or {}).items()}
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.server, []).append(cell)
    with open(out / "measured.jsonl", "w") as f:
        def keep(role: str, server_name: str, m: Measured, info: dict) -> None:
            f.write(json.dumps({"role": role, "server": server_name, "cell": asdict(m.cell), "rate": m.rate,
                                "t0": m.t0, "window": m.window, "info": info,
                                "records": [asdict(r) for r in m.records]}) + "\n")
            f.flush()

        def rate_of(target, name: str, cell: Cell, served: ServedCost) -> float:
            one = scheduler_name(cell.scheduler, cell.token_budget)
            if cell.mix not in saturation.get(name, {}):
                if cell.replicas > 1 and cell.mix in saturation.get(one, {}):
                    saturation.setdefault(name, {})[cell.mix] = cell.replicas * saturation[one][cell.mix]
                else:
                    guess = estimate_capacity(ClusterConfig(served, cell.replicas, cell.policy), cell.workload(1.0))
                    rate, run = saturation_rate(target, cell, overload * guess, client_processes, timeout)
                    saturation.setdefault(name, {})[cell.mix] = rate
                    keep("calibration", name, run, target.info)
                    progress(f"{name} {cell.mix}: measured saturation {rate:.3g} req/s (the simulator's estimate "
                             f"{guess:.3g})")
            return cell.load * saturation[name][cell.mix]

        def run_cells(target, name: str, group: list[Cell]) -> None:
            for cell in group:
                if time.monotonic() > deadline:
                    progress(f"{name} {cell.mix} load {cell.load} clients {cell.clients}{_cap(cell)}: skipped "
                             "(time budget)")
                    continue
                served = ServedCost(estimate, target.info["kv_total_blocks"], target.info["max_model_len"])
                rate = None
                if cell.load is not None:
                    rate = rate_of(target, name, cell, served)
                    if cell_seconds:
                        cell = dataclasses.replace(cell, num_requests=min(
                            cell.num_requests, max(50, int(rate * cell_seconds))))
                progress(f"{name} {cell.balancer if cell.replicas > 1 else ''} {cell.mix} load {cell.load} "
                         f"clients {cell.clients}{_cap(cell)}{f' repeat {cell.repeat}' if cell.repeat else ''}: "
                         f"{cell.num_requests} requests")
                keep("cell", name, send_cell(target, cell, rate, client_processes, timeout), target.info)

        for name, group in groups.items():
            first = group[0]
            replicas = first.replicas
            slots = replica_slots(engine_options.get("device") or "cuda", replicas) if replicas > 1 \
                else [None]
            with contextlib.ExitStack() as stack:
                servers = [Server(model, first.policy, engine_options, trace, out / f"server-{name}-r{i}.log"
                                  if replicas > 1 else out / f"server-{name}.log", env=slots[i], cpus=server_cpus)
                           for i, trace in enumerate(trace_files(out, name, replicas))]
                for server in servers:  # the engines load side by side
                    server.start()
                    stack.callback(server.__exit__, None, None, None)
                for server in servers:
                    server.wait_ready()
                info = servers[0].info
                progress(f"server {name} ready: {replicas} x {info['kv_total_blocks']} KV blocks, context "
                         f"{info['max_model_len']}")
                if warmup_requests:
                    warm = dataclasses.replace(first, num_requests=warmup_requests, load=None,
                                               clients=min(16, warmup_requests), seed=10_007)
                    for server in servers:
                        keep("calibration", name, send_cell(server, warm, None, client_processes, timeout), info)
                if replicas == 1:
                    run_cells(servers[0], name, group)
                    continue
                urls = tuple(s.url for s in servers)
                first_of_mix: dict[str, Cell] = {}
                for cell in group:
                    if cell.load is not None:
                        first_of_mix.setdefault(cell.mix, cell)
                for cell in first_of_mix.values():  # the loads' saturation rates, on a router of their own
                    if cell.mix not in saturation.get(name, {}) and time.monotonic() <= deadline:
                        with fleet_router(model, cell, engine_options, out / f"router-{name}-saturation-{cell.mix}.log",
                                          urls, server_cpus) as r:
                            rate_of(Fleet(servers, r), name, cell,
                                    ServedCost(estimate, info["kv_total_blocks"], info["max_model_len"]))
                for i, cell in enumerate(group):
                    if time.monotonic() > deadline:
                        run_cells(None, name, [cell])  # says it is skipped
                        continue
                    with fleet_router(model, cell, engine_options, out / f"router-{name}-{cell.balancer}-{i}.log",
                                      urls, server_cpus) as r:
                        run_cells(Fleet(servers, r), name, [cell])
    meta = {"model": model, "engine_options": engine_options, "saturation_rps": saturation,
            "client_processes": client_processes, "warmup_requests": warmup_requests,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": os.environ.get("SPLITFUSE_GIT_COMMIT", ""), "sampler": SAMPLER_DRAW, "host": host_facts(),
            "server_cpus": format_cpu_list(server_cpus or os.sched_getaffinity(0)),
            "client_cpus": format_cpu_list(os.sched_getaffinity(0))}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))


def load_measured(directory: Path, role: str = "cell") -> tuple[dict, list[tuple[str, Measured, dict]], dict]:
    """(meta, [(server name, measured run, server info)] of the runs of ``role`` ("cell": the compared cells;
    "calibration": the warm-up and overload runs), {server name: (trace passes, trace requests), or None where the
    run was cut short before its servers wrote their traces: the client's view is all there is})."""
    meta_file = directory / "meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {"note": "cut short: no meta.json"}
    runs, traces, prompt_tokens = [], {}, {}
    for line in (directory / "measured.jsonl").read_text().splitlines():
        row = json.loads(line)
        prompt_tokens.update((r["response_id"], r["prompt_tokens"]) for r in row["records"])
        if row.get("role", "cell") != role:
            continue
        m = Measured(Cell(**row["cell"]), row["rate"], [Record(**r) for r in row["records"]], row["t0"],
                     tuple(row["window"]))
        runs.append((row["server"], m, row["info"]))
        if row["server"] not in traces:
            paths = trace_files(directory, row["server"], m.cell.replicas)
            traces[row["server"]] = read_traces(paths) if all(p.exists() for p in paths) else None
    for trace in traces.values():
        if trace is not None:
            fill_decode_max_context(*trace, prompt_tokens)
    return meta, runs, traces


def run_host(meta: dict, directory: Path, override: str | None = None) -> str:
    """The host a measured run ran on, as the serving fit groups runs: ``override`` where given, else the cards its
    ``meta.json`` records (the start of each UUID: lent machines share one host name, and two cards of one machine
    differ as two hosts do), else its host name, else its folder's name (runs from before hosts were recorded: each
    its own host)."""
    host = meta.get("host", {})
    cards = "+".join(gpu["uuid"][:12] for gpu in host.get("gpus", []) if gpu.get("uuid"))
    return override or cards or host.get("hostname") or _folder_name(directory)


def run_sampler(meta: dict, override: str | None = None) -> str:
    """How the engine of a run with ``meta`` drew sampled tokens (``engine.config.SAMPLER_DRAWS``): ``override``
    (``--sampler-of``), else as recorded, else "sort", as every engine did before runs recorded it."""
    return override or meta.get("sampler") or SAMPLER_DRAWS[0]


def serving_measurements(directory: Path, cost, host: str | None = None, cells: bool = False,
                         heat_tau_s: float = HEAT_TAU_S, sampler_saved=None, sampler: str | None = None,
                         calibration: bool = True) -> tuple[list[dict], list[dict]]:
    """What ``calibration.serving.fit_serving`` fits, from the warm-up and overload runs alone (kept apart from the
    cells it is then judged on): their traced passes (served step, ``cost``'s prediction of it, the loop's work
    until the next step) and their requests (admission: client send to the engine process; delivery: the end of
    the pass that made the first and the last token to the client's receipt, with that pass's sampled entries).
    ``cost``: a profile without a serving section. Delivery comes from the overload runs, sent as the cells are
    (open loop, fresh client processes); admission from those and (``light``) from the warm-up's closed-loop
    clients after each one's first request, when the engine has compiled its kernels (which delays admission
    tenfold) and the server is lightly loaded. Each client process's first request is left out: before
    ``sim.bench.warm_up`` it paid the client's own start-up, and the simulator's clients are warm. Every row names
    its ``host`` (``run_host``; ``host`` overrides the recorded one), by which the fit weighs hosts equally. With
    ``cells``, the passes hold the cells' too (the requests do not): those a fit judged on these cells must not see;
    without ``calibration``, only the cells' passes (and no requests).
    ``heat_tau_s``: the time constant of the passes' heat (``cell_passes``), the section's being fitted.
    ``sampler_saved``: a section's ``sampler_saved_seconds``; in a run whose engine draws as today's
    (``run_sampler``, ``sampler`` overriding what it recorded) each sampled pass's step gets it back, so that a fit
    against the sweep's price sees the step as the sweep's sampler would have run it, as the section prices it."""
    meta, runs, traces = load_measured(directory, "calibration")
    processes = int(meta.get("client_processes", 1))  # process p sent rows p, p + processes, ...
    host = run_host(meta, directory, host)
    saved = sampler_saved if sampler_saved is not None and run_sampler(meta, sampler) == SAMPLER_DRAW else None
    passes, requests = [], []
    _, cell_runs, cell_traces = load_measured(directory) if cells else ({}, [], {})
    calibration_runs = [(name, m, False) for name, m, _ in runs] if calibration else []
    for name, m, is_cell in calibration_runs + [(name, m, True) for name, m, _ in cell_runs]:
        trace = (cell_traces if is_cell else traces)[name]
        if trace is None:
            continue
        trace_passes, trace_requests = trace
        for p in cell_passes(m, trace_passes, cost, heat_tau_s):
            back = saved(p["num_samples"], p["prefill_tokens"]) if saved and m.cell.temperature > 0 else 0.0
            passes.append({"host": host, "path": scale_path(p["path"], p["decode_tokens"]),
                           "pass_s": p["pass_s"] + back,
                           "model_s": p["predicted_s"], "num_samples": p["num_samples"], "serving_s": p["serving_s"],
                           "heat": p["heat"], "attention_s": p["attention_s"], "prefill_tokens": p["prefill_tokens"],
                           "greedy": m.cell.temperature == 0, "discarded": p["discarded"],
                           "bucket": cost.model.bucket(PassFeatures.from_mapping(p)) if p["passes"] == 1 else 0,
                           "spread_tokens": decode_spread_tokens(p["decode_tokens"], p["decode_context"],
                                                                 p["decode_max_context"])})
        if is_cell:
            continue
        if m.cell.clients:  # rows 0 .. clients - 1 are each client's first, sent together at the start
            requests += [{"host": host, "id": r.id, "prompt_tokens": r.prompt_tokens, "light": True,
                          "admission_s": trace_requests[r.response_id]["received"] - m.t0 - r.arrival,
                          "delivery_s": float("nan"), "num_samples": float("nan")}
                         for r in m.records if r.id >= m.cell.clients]
            continue
        # a token's time is the end of the pass that made it
        sampled_at = {p["end"]: p["num_samples"] for engine in trace_passes for p in engine}
        for r in m.records:
            if r.id < processes:
                continue
            row = trace_requests[r.response_id]
            sent = m.t0 + r.arrival
            for server_time, client_time in ((row["token_times"][0], r.chunk_times[0]),
                                             (row["token_times"][-1], r.chunk_times[-1])):
                requests.append({"host": host, "id": r.id, "prompt_tokens": r.prompt_tokens, "light": False,
                                 "admission_s": row["received"] - sent,
                                 "delivery_s": m.t0 + client_time - server_time,
                                 "num_samples": sampled_at.get(server_time, float("nan"))})
    return passes, requests


def router_hop(directory: Path, cost: CostModel) -> tuple[RouterCost, float, float] | None:
    """What the router of ``directory``'s fleet cells added to each request's way in (client send to the engine's
    receipt, less ``cost``'s mean admission of its prompt) and to its first token's way out (the pass's end to the
    client, less ``cost``'s delivery after that pass), as the ``RouterCost`` (what ``sim.router.SERVE_ROUTER``
    prices) of the least-squares lines (non-negative) through them over the streams open at the router then (the
    client's: requests sent and not yet finished; on the way in the others, on the way out its own too), and the
    mean hop in and out in seconds. None where the run has no traced fleet cell."""
    _, runs, traces = load_measured(directory)
    ins, outs, prompts, open_in, open_out = [], [], [], [], []
    for name, m, _ in runs:
        if m.cell.replicas < 2 or traces.get(name) is None:
            continue
        trace_passes, trace_requests = traces[name]
        sampled_at = {p["end"]: p["num_samples"] for engine in trace_passes for p in engine}
        sent = np.array([r.arrival for r in m.records])
        done = np.array([r.chunk_times[-1] if r.chunk_times else r.arrival for r in m.records])
        for r in m.records:
            row = trace_requests[r.response_id]
            first = row["token_times"][0]
            ins.append(row["received"] - m.t0 - r.arrival)
            prompts.append(r.prompt_tokens)
            open_in.append(int(np.count_nonzero((sent < r.arrival) & (done > r.arrival))))
            if first in sampled_at:
                outs.append(m.t0 + r.chunk_times[0] - first - cost.delivery_seconds(sampled_at[first]))
                t = r.chunk_times[0]
                open_out.append(int(np.count_nonzero((sent < t) & (done >= t))))
    if not ins:
        return None
    draws = 1024  # the admission's mean over its distribution: evenly spread uniforms for each prompt
    uniforms = (np.arange(draws) + 0.5) / draws
    mean_admission = {p: float(np.mean(cost.admission_seconds(np.full(draws, p), uniforms))) for p in set(prompts)}
    ins = np.array(ins) - np.array([mean_admission[p] for p in prompts])
    line_in, line_out = _hop_line(open_in, ins), _hop_line(open_out, outs)
    hop = RouterCost(admission_s=line_in[0], delivery_s=line_out[0], admission_per_stream_s=line_in[1],
                     delivery_per_stream_s=line_out[1])
    return hop, float(np.mean(ins)), float(np.mean(outs)) if outs else float("nan")


def _hop_line(streams, hops) -> tuple[float, float]:
    """(intercept, slope) of the non-negative least-squares line of ``hops`` (seconds) over ``streams``."""
    from scipy.optimize import nnls

    if not len(hops):
        return 0.0, 0.0
    coef, _ = nnls(np.column_stack([np.ones(len(streams)), np.asarray(streams, dtype=float)]), np.asarray(hops))
    return float(coef[0]), float(coef[1])


def served_ratios(directory: Path, cost, host: str | None = None) -> tuple[str, list[np.ndarray]]:
    """The run's host (``run_host``) and, per warm-up or overload run and engine, each traced pass's served time
    (step and loop, ``cell_passes``' ``loop_s``: where the next step began at once) over ``cost``'s price of it:
    what ``calibration.serving.served_noise`` measures the served passes' spread on."""
    meta, runs, traces = load_measured(directory, "calibration")
    ratios = []
    for name, m, _ in runs:
        if traces[name] is None:
            continue
        rows = cell_passes(m, traces[name][0], cost)
        for replica in range(m.cell.replicas):
            r = np.array([p["loop_s"] / p["predicted_s"] for p in rows if p["replica"] == replica
                          and np.isfinite(p["loop_s"]) and np.isfinite(p["predicted_s"]) and p["predicted_s"] > 0])
            if len(r):
                ratios.append(r)
    return run_host(meta, directory, host), ratios


def with_served_noise(profile, measured: tuple[Path, ...], hosts: dict[Path, str]):
    """``profile`` with its serving section's spread (``noise_q``) measured on the warm-up and overload runs of
    ``measured`` (``served_ratios``; ``hosts``: their labels), each host weighing as one. Its measured hosts are
    kept: record them again (``with_measured_hosts``) where their runs are at hand, since the spread's mean moves
    the simulated rates they were judged by."""
    if profile.serving is None:
        raise ValueError("the profile has no serving section to price the served passes with (--fit-serving first)")
    ratios: dict[str, list[np.ndarray]] = {}
    for directory in measured:
        host, runs = served_ratios(directory, profile, hosts.get(directory))
        ratios.setdefault(host, []).extend(runs)
    noise_q, fit = served_noise(ratios)
    serving = profile.serving.with_noise(noise_q, fit)
    return profile.with_serving(serving).with_hosts(profile.hosts)


def greedy_ratios(directory: Path, profile, host: str | None = None, cells: bool = False) -> list[dict]:
    """What ``calibration.serving.fit_greedy`` fits, from ``directory``'s greedy warm-up and overload runs (sent at
    temperature 0), or with ``cells`` from its greedy cells: each decode-graph step's price (the sampled price with
    the sampler's saving since the sweep given back, as ``Profile.greedy_seconds`` starts from) less its served time
    (step and loop) and its sampled entries, enqueued ahead (``kind`` "ahead") or not ("step"); and each pass that
    follows a decode pass ahead the engine discarded ("discarded"): its served time beyond its price, over the price
    of the decode step before it, which the discarded pass repeated. The trace names the passes that discarded one
    (``PassRecord.discarded``); in traces from before it did, a pass with prompt tokens after a greedy decode-graph
    step in which no request reached its last token, not run ahead, is taken for one: the engine enqueues ahead
    after such a step when no request waits (``Scheduler.next_decode_plan``), so a request arrived meanwhile (one
    that waited already would have been admitted into the decode step, but where the batch or the KV cache was full,
    which a decode step alone does not show). Only under a scheduler that puts decodes first: one that does not
    enqueues nothing ahead of a step in which a request starts a KV block, which a trace does not show either."""
    meta, runs, traces = load_measured(directory, "cell" if cells else "calibration")
    host = run_host(meta, directory, host)
    card = profile.new_heat()
    windows: dict[str, list[tuple[float, float]]] = {}
    decodes_first = {}
    for name, m, _ in runs:
        if m.cell.temperature == 0 and traces[name] is not None:
            windows.setdefault(name, []).append(m.window)
            decodes_first[name] = scheduler_class(m.cell.scheduler).decodes_first
    rows = []
    for name, spans in windows.items():
        trace_passes, trace_requests = traces[name]
        last_tokens = {r["token_times"][-1] for r in trace_requests.values() if r["token_times"]}
        for engine in trace_passes:
            heats = prefill_heats(engine, card.tau_s if card is not None else HEAT_TAU_S)
            # the price a greedy pass is priced from (``Profile.greedy_seconds``): the sampled one with what the
            # sampler saves since the sweep given back, since a greedy pass never runs the sampler
            price = [profile.predict(f, heats[i]) + profile.serving.sampler_saved_seconds(f.num_samples,
                                                                                          f.prefill_tokens)
                     for i, f in enumerate(map(PassFeatures.from_mapping, engine))]
            for i in range(1, len(engine) - 1):
                before, p, after = engine[i - 1], engine[i], engine[i + 1]
                if not any(lo <= p["start"] <= hi for lo, hi in spans) or p["num_samples"] == 0 \
                        or after["start"] - p["sent"] >= 1e-3:  # idle after it, or its work timed in the next
                    continue
                served = after["start"] - p["start"]
                if p["path"] == "decode-graph":
                    rows.append({"host": host, "kind": "ahead" if p["ahead"] else "step",
                                 "num_samples": p["num_samples"], "saved_s": price[i] - served})
                if "discarded" in p:
                    discarded = p["discarded"] and p["end"] not in last_tokens
                else:
                    discarded = (decodes_first[name] and before["path"] == "decode-graph"
                                 and before["end"] not in last_tokens and p["end"] not in last_tokens
                                 and not p["ahead"] and p["prefill_tokens"] > 0)
                if discarded:
                    rows.append({"host": host, "kind": "discarded", "ratio": (served - price[i]) / price[i - 1]})
    return rows


def with_greedy(profile, measured: tuple[Path, ...], hosts: dict[Path, str], cells: bool = False):
    """``profile`` with its serving section's greedy decode steps measured on the greedy warm-up and overload runs
    of ``measured`` (``greedy_ratios``; ``hosts``: their labels), or with ``cells`` on their greedy cells alone,
    each host weighing as one. The cells are what a section judged on other runs should see: an overload run's
    steps ahead run at its large batches, a cell's below saturation at a few to a hundred entries."""
    from calibration.serving import fit_greedy

    if profile.serving is None:
        raise ValueError("the profile has no serving section to price the served steps with (--fit-serving first)")
    rows = [row for directory in measured for row in greedy_ratios(directory, profile, hosts.get(directory), cells)]
    greedy, fit = fit_greedy(rows)
    fit = {**fit, "source": "cells" if cells else "warm-up and overload runs"}
    return profile.with_serving(profile.serving.with_greedy(greedy, fit)).with_hosts(profile.hosts)


def compare(directory: Path, cost: CostModel | list[CostModel], out: Path | None = None, sim_seeds: int = 1,
            exclude_first: bool = False, cell_cost=None) -> dict:
    """Simulate every measured cell of ``directory`` on ``cost`` (or a list, one per engine: ``engine_costs``;
    ``cell_cost``: a function of the cell giving its own, e.g. the typical host of its mix); write
    ``validation.csv``, ``errors.csv``, ``passes.csv``, ``delivery.csv`` and ``report.html`` into ``out`` (default:
    ``directory``). ``sim_seeds`` > 1: also ``sim_seeds.csv``, the spread of the simulator's headline metrics over
    that many seeds.
    ``exclude_first``: leave each client's first requests (``first_requests``) out of both sides' metrics, for
    runs sent before the client warmed up (``sim.bench.warm_up``), whose first requests carried its start-up."""
    import pandas as pd

    out = out or directory
    out.mkdir(parents=True, exist_ok=True)
    meta, cells, traces = load_measured(directory)
    processes = int(meta.get("client_processes", 1))
    rows, passes_rows, delivery_rows, spread_rows, routed_rows = [], [], [], [], []
    simulations = {}  # a cell's repeats run the same requests: one simulation serves them all
    for name, m, info in cells:
        of_cell = cell_cost(m.cell) if cell_cost else cost
        served = [ServedCost(c, info["kv_total_blocks"], info["max_model_len"])
                  for c in engine_costs(of_cell, m.cell.replicas)]
        served = served if isinstance(of_cell, (list, tuple)) else served[0]
        trace_passes, trace_requests = traces[name] or ([], None)
        first = first_requests(m.cell, processes) if exclude_first else 0
        once = (dataclasses.replace(m.cell, repeat=0), m.rate, info["kv_total_blocks"], info["max_model_len"])
        if once not in simulations:
            simulations[once] = simulated(m.cell, m.rate, served, first_id=first)
            if sim_seeds > 1:
                spread_rows += seed_spread(m.cell, m.rate, served, sim_seeds, simulations[once][0], first)
        sim_summary, sim_server, _ = simulations[once]
        kept = [r for r in m.records if r.id >= first]
        cell_views = views(dataclasses.replace(m, records=kept), trace_requests)
        pass_rows = cell_passes(m, trace_passes, served)
        passes_rows += pass_rows
        stats = {"mean_tokens_per_pass": float(np.mean([p["num_tokens"] for p in pass_rows])) if pass_rows
                 else float("nan")}
        for source, result in (("sim", sim_summary), ("sim-server", sim_server), *cell_views.items()):
            summary = result if source.startswith("sim") else {**summarize(result, SLA()), **stats}
            rows.append({**m.cell.keys(), "rate": m.rate, "source": source, **metric_columns(summary)})
        if trace_requests is None:
            continue
        if m.cell.replicas > 1:
            routed = simulated(m.cell, m.rate, served, first_id=first, server_view=False,
                               routes=measured_routes(m, trace_requests))[0]
            routed_rows.append({**m.cell.keys(), "rate": m.rate, "source": "sim-routed", **metric_columns(routed)})
        for r, s in zip(kept, cell_views["server"].columns["first_token"]):
            delivery_rows.append({**m.cell.keys(), "id": r.id, "server_first_token": s,
                                  "client_first_token": r.chunk_times[0],
                                  "server_finish": trace_requests[r.response_id]["token_times"][-1] - m.t0,
                                  "client_finish": r.chunk_times[-1], "output_tokens": r.output_tokens})
    frame, passes, delivery = pd.DataFrame(rows), pd.DataFrame(passes_rows), pd.DataFrame(delivery_rows)
    errors = with_bounds(relative_errors(frame))
    frame.to_csv(out / "validation.csv", index=False)
    errors.to_csv(out / "errors.csv", index=False)
    repeated = None
    if (frame["repeat"] > 0).any():
        repeated = with_bounds(repeat_errors(frame))
        repeated.to_csv(out / "errors_repeats.csv", index=False)
    passes.to_csv(out / "passes.csv", index=False)
    delivery.to_csv(out / "delivery.csv", index=False)
    if spread_rows:
        pd.DataFrame(spread_rows).to_csv(out / "sim_seeds.csv", index=False)
    routing = None
    if routed_rows:
        routing = routing_errors(pd.concat([frame, pd.DataFrame(routed_rows)], ignore_index=True))
        routing.to_csv(out / "routing.csv", index=False)
    first = cost[0] if isinstance(cost, (list, tuple)) else cost
    profile_meta = first.meta if first is cost else \
        {**first.meta, "host_path_factors": [c.meta.get("host_path_factors") for c in cost]}
    report_meta = {**meta, "profile": profile_meta, "serving": getattr(first, "serving", None) is not None,
                   "excluded": "each client's first requests" if exclude_first else None}
    from sim.validation_report import write_report

    write_report(out / "report.html", frame, errors, passes, delivery, report_meta)
    return {"validation": frame, "errors": errors, "passes": passes, "delivery": delivery, "repeats": repeated,
            "routing": routing}


def relative_errors(frame):
    """The simulator's relative error, (sim - measured) / measured, against the server's and the client's view (each
    against the simulator's own view of it: ``VIEWS``), one row per cell and view."""
    import pandas as pd

    metrics = [c for c in frame.columns if c not in (*CELL_KEYS, "rate", "source", "requests")]
    keyed = frame.assign(load=frame["load"].fillna(-1))  # NaN keys would not match
    rows = []
    for view in [v for v in VIEWS if (keyed.source == v).any()]:
        sim = keyed[keyed.source == VIEWS[view]].set_index(list(CELL_KEYS))[metrics]
        measured = keyed[keyed.source == view].set_index(list(CELL_KEYS))[metrics]
        error = (sim - measured) / measured
        rows.append(error.assign(view=view).reset_index())
    out = pd.concat(rows, ignore_index=True)
    out["load"] = out["load"].where(out["load"] >= 0)
    return out


def repeat_errors(frame):
    """The simulator's relative error against the mean of each cell's measured repeats, one row per cell and view
    (cell keys but ``repeat``): ``repeats`` (how many ran) and, per ``SPREAD_METRICS``, ``<metric>_spread``: the
    repeats' standard deviation over their mean, the engine against itself on the same requests. A mean of n
    repeats has a spread of its own about ``<metric>_spread`` / sqrt(n). Every metric is averaged over the repeats
    (a percentile too: the mean of each repeat's); the simulator ran each cell once."""
    import pandas as pd

    keys = [k for k in CELL_KEYS if k != "repeat"]
    metrics = [c for c in frame.columns if c not in (*CELL_KEYS, "rate", "source", "requests")]
    keyed = frame.assign(load=frame["load"].fillna(-1))  # NaN keys would not group
    rows = []
    for view in [v for v in VIEWS if (keyed.source == v).any()]:
        sim = keyed[keyed.source == VIEWS[view]].groupby(keys)[metrics].first()
        runs = keyed[keyed.source == view].groupby(keys)
        mean = runs[metrics].mean()
        spread = (runs[list(SPREAD_METRICS)].std() / mean[list(SPREAD_METRICS)]).add_suffix("_spread")
        error = (sim.loc[mean.index] - mean) / mean
        rows.append(error.assign(view=view, repeats=runs.size()).join(spread).reset_index())
    out = pd.concat(rows, ignore_index=True)
    out["load"] = out["load"].where(out["load"] >= 0)
    return out


# -- command line --------------------------------------------------------------------------------------------
def _schedulers(specs: tuple[str, ...]) -> list[tuple[str, int]]:
    out = []
    for spec in specs:
        name, _, budget = spec.partition(":")
        try:
            out.append((name, int(budget) if budget else PolicyConfig().max_num_batched_tokens))
        except ValueError:
            raise ValueError(f"--scheduler {spec!r}: expected NAME[:TOKEN_BUDGET], e.g. splitfuse:768") from None
    return out


def _numbers(text: str | None, flag: str, kind=float) -> list:
    if not text:
        return []
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated numbers") from None
    if any(not v > 0 for v in values):
        raise ValueError(f"{flag} {text!r}: every value must be > 0")
    return values


def _caps(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()] or [0]
    except ValueError:
        raise ValueError(f"--max-concurrency {text!r}: expected comma-separated whole numbers (0: no cap)") from None


def parse_mix(spec: str) -> tuple[str, str, str]:
    """``NAME`` (one of ``MIXES``) or ``NAME=PROMPT_LENGTHS/OUTPUT_LENGTHS`` -> (name, prompt spec, output spec)."""
    name, _, lengths = spec.partition("=")
    if not lengths:
        if name not in MIXES:
            raise ValueError(f"--mix {spec!r}: choose from {', '.join(MIXES)} or give NAME=PROMPT/OUTPUT lengths")
        return (name, *MIXES[name])
    prompt, _, output = lengths.partition("/")
    parse_length(prompt, f"--mix {spec!r}: prompt lengths"), parse_length(output, f"--mix {spec!r}: output lengths")
    return name, prompt, output


def make_cells(schedulers, mixes, loads, clients, num_requests: int, seed: int, replicas: int = 1,
               balancers: tuple[str, ...] = (), repeats: int = 1, caps=(0,), temperature: float = 1.0) -> list[Cell]:
    """Every scheduler x mix x (load x cap on requests in flight, 0: none; or client count) at one sampling
    ``temperature``; a fleet's cells once per balancer; the whole grid ``repeats`` times over, a round after
    another (a drift of the card over the run then spreads over every cell rather than landing on one cell's
    repeats)."""
    from engine.policy import make_balancer

    if not loads and not clients:
        raise ValueError("give --loads (open loop, shares of the measured saturation rate) or --clients (closed)")
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    for balancer in balancers:
        make_balancer(balancer)
    balancers = (balancers or (PolicyConfig().balancer,)) if replicas > 1 else (PolicyConfig().balancer,)
    mixes = [parse_mix(m) for m in mixes]
    fleet = [{"replicas": replicas, "balancer": b} for b in balancers]
    if any(not isinstance(c, int) or c < 0 for c in caps):
        raise ValueError(f"--max-concurrency {caps}: every cap must be a whole number >= 0 (0: no cap)")
    if not temperature >= 0:
        raise ValueError(f"--temperature must be >= 0, got {temperature!r}")
    cells = [Cell(s, b, *m, num_requests, load=x, seed=seed, max_concurrency=c, temperature=temperature, **f)
             for s, b in schedulers for f in fleet for m in mixes for x in loads for c in caps]
    cells += [Cell(s, b, *m, num_requests, clients=c, seed=seed, temperature=temperature, **f) for s, b in schedulers
              for f in fleet for m in mixes for c in clients]
    return [dataclasses.replace(cell, repeat=r) for r in range(repeats) for cell in cells]


def is_saturation_run(cell: Cell) -> bool:
    """Whether a calibration run of ``cell`` measured a saturation rate: an overload run, of one engine or a fleet."""
    return not cell.clients and cell.load is None


def is_overload_run(cell: Cell) -> bool:
    """Whether a calibration run of ``cell`` is a single engine's overload run, the one that measured its saturation
    rate (not the closed-loop warm-up, not a fleet's)."""
    return is_saturation_run(cell) and cell.replicas == 1


def measured_hosts(directory: Path, cost: CostModel, host: str | None = None) -> list[MeasuredHost]:
    """One ``MeasuredHost`` per single-engine overload run of ``directory`` (the runs that measured a saturation
    rate): its ``steady_throughput`` as served and as simulated with ``cost`` on the same seeded requests and the KV
    cache the server had, and that run (``overload_run``) to simulate again. ``host`` overrides the run's recorded
    host (``run_host``)."""
    meta, runs, _ = load_measured(directory, "calibration")
    label = run_host(meta, directory, host)
    rows = []
    for name, m, info in runs:
        if not is_overload_run(m.cell):
            continue
        run = overload_run(m.cell, m.rate, info)
        rows.append(MeasuredHost(label, name, m.cell.mix,
                                 steady_throughput([r.chunk_times[-1] for r in m.records], concurrency_of(run)),
                                 simulated_overload_rps(cost, run),
                                 str(meta.get("date", ""))[:10], str(meta.get("commit", "")), run))
    return rows


def overload_run(cell: Cell, rate: float, info: dict) -> dict:
    """What simulating an overload run again takes, as a measured host's ``run`` keeps it (``calibration.host_spread.
    RUN_KEYS``): its requests (the cell's mix and seed), the rate they were sent at, and the KV cache and context
    limit the server had."""
    return {"scheduler": cell.scheduler, "token_budget": cell.token_budget, "mix": cell.mix, "prompt": cell.prompt,
            "output": cell.output, "num_requests": cell.num_requests, "seed": cell.seed,
            "temperature": cell.temperature, "rate": float(rate), "kv_total_blocks": int(info["kv_total_blocks"]),
            "max_model_len": int(info["max_model_len"])}


def _overload_cell(run: Mapping) -> Cell:
    return Cell(run["scheduler"], run["token_budget"], run["mix"], run["prompt"], run["output"], run["num_requests"],
                seed=run["seed"], temperature=run["temperature"])


def concurrency_of(run: Mapping) -> int:
    """How many of an overload ``run``'s requests its engine holds at once (``engine_concurrency``)."""
    return engine_concurrency(_overload_cell(run), run)


def simulated_overload_rps(cost: CostModel, run: Mapping) -> float:
    """The steady requests/s of an overload ``run`` (``overload_run``) as the simulator serves it with ``cost``."""
    cell = _overload_cell(run)
    served = ServedCost(cost, run["kv_total_blocks"], run["max_model_len"])
    result = simulate(cell.workload(run["rate"]), ClusterConfig(served, 1, cell.policy), seed=cell.seed,
                      workload_seed=cell.seed)
    return steady_throughput(result.columns["finish"], concurrency_of(run))


def rehosted(profile):
    """``profile`` with each measured host's run that keeps its overload run simulated again on it: a fit that
    moves the prices moves those rates, and a ratio holds only for the profile it was simulated with."""
    if profile.hosts is None or not any(row.run for row in profile.hosts.runs):
        return profile
    rows = tuple(dataclasses.replace(row, simulated_rps=simulated_overload_rps(profile, row.run)) if row.run else row
                 for row in profile.hosts.runs)
    return profile.with_hosts(HostSpread(rows))


MIN_PATH_PASSES = 20  # fewer traced passes of a path than this give it no factor of its own
OVERLOAD_DECODE_MAX_SEQS = 128  # decode steps of an overload run up to this batch are like a cell's below saturation


def overload_path_factors(directory: Path, cost: CostModel,
                          decode_max_seqs: int = OVERLOAD_DECODE_MAX_SEQS) -> list[dict[str, float]]:
    """Per engine (a fleet's replica order; one for a single engine), {serving path: served / predicted loop time}
    over its passes in ``directory``'s overload runs (those that measured a saturation rate, outside every cell),
    for the paths with ``MIN_PATH_PASSES`` or more: how much slower than ``cost`` the card that ran them runs each
    path, as ``SlowerHost(cost, path_factors=...)`` takes it. Predicted is what a simulated pass takes on average:
    the median times the mean of ``cost``'s spread (``mean_noise_factor``). Empty where the runs traced no overload
    run.

    Passes with prompt tokens count at any size: they are the same chunks and prompts at every load. Decode steps
    alone count up to ``decode_max_seqs`` sequences (0: none): an overload run's largest decode batches are larger
    than any cell's below saturation, and their error there is the batch's, not the host's (``calibration/
    VALIDATION.md``, twenty-third and twenty-ninth rounds). A greedy run's passes count at their greedy prices
    (``cell_passes``), decode steps enqueued ahead too: they are 69-98% of a greedy cell's decode steps, while an
    overload run holds only about 140 not ahead of up to that batch, which misread a card by up to 5% (forty-second
    round). An engine whose passes with decodes and prompts ran mostly as mixed graphs (splitfuse at budgets up to
    the graphs' tokens) takes their factor for its decode steps too: its overload run steps decodes alone only while
    the first batch fills and the last drains, where they misread the card by up to 4%, and its mixed passes run all
    through. Where such passes ran mostly eager (budgets over the graphs' tokens), its mixed graphs are the few
    remainders of prompts, hot beside many decodes, which read the card slower than its decode steps (fifty-eighth
    round); its decode steps keep their own factor."""
    _, runs, traces = load_measured(directory, "calibration")
    served, predicted, count = {}, {}, {}  # (engine, path) -> sums
    engines = 0
    for name, m, info in runs:
        if not is_saturation_run(m.cell) or traces.get(name) is None:
            continue
        engines = max(engines, len(traces[name][0]))
        for row in cell_passes(m, traces[name][0], ServedCost(cost, info["kv_total_blocks"], info["max_model_len"])):
            if not (np.isfinite(row["loop_s"]) and np.isfinite(row["predicted_s"])):
                continue
            if row["prefill_tokens"] or row["num_seqs"] <= decode_max_seqs:
                key = (row["replica"], scale_path(row["path"], row["decode_tokens"]))
                served[key] = served.get(key, 0.0) + row["loop_s"]
                predicted[key] = predicted.get(key, 0.0) + row["predicted_s"]
                count[key] = count.get(key, 0) + 1
    mean = mean_noise_factor(cost)  # a simulated pass takes its median times the spread's mean: the host's excess
    return [decode_steps_as_mixed({path: served[e, path] / (mean * predicted[e, path]) for e, path in sorted(served)
                                   if e == engine and count[e, path] >= MIN_PATH_PASSES},
                                  {path: n for (e, path), n in count.items() if e == engine})
            for engine in range(engines)]


def decode_steps_as_mixed(factors: Mapping[str, float], counts: Mapping[str, int]) -> dict[str, float]:
    """An engine's path ``factors`` with its decode steps' factor taken from its mixed graphs where ``counts`` (its
    passes per path) show that its passes with prompts beside decodes ran mostly as mixed graphs, not eager
    (``overload_path_factors``)."""
    factors = dict(factors)
    if ("mixed-graph" in factors and "decode-graph" in factors
            and counts.get("mixed-graph", 0) >= counts.get("eager", 0)):
        factors["decode-graph"] = factors["mixed-graph"]
    return factors


def typical_cells(cost, directory: Path, host: str | None = None, echo=None):
    """A function of a cell of the run in ``directory`` giving ``cost`` on the typical host of its mix and scheduler
    (``sim.costs.typical_host``), the run's own host (``run_host``) left out; ``echo`` is told each factor once."""
    meta_file = directory / "meta.json"
    own = run_host(json.loads(meta_file.read_text()) if meta_file.exists() else {}, directory, host)
    seen = set()

    def of_cell(cell: Cell):
        key = (cell.mix, scheduler_name(cell.scheduler, cell.token_budget))
        typical = typical_host(cost, *key, without=own)
        if echo and key not in seen:
            seen.add(key)
            echo(f"{directory}: {key[0]} on {key[1]}, the typical host other than {own}: pass time x "
                 f"{typical.factor:.4f}")
        return typical

    return of_cell


def with_measured_hosts(profile, measured: tuple[Path, ...], hosts: dict[Path, str]):
    """``profile`` with the hosts of the ``measured`` runs (``measured_hosts``; ``hosts``: their labels) added to
    those it holds (``calibration.host_spread``); a run measured again replaces its earlier row."""
    rows = [row for directory in measured for row in measured_hosts(directory, profile, hosts.get(directory))]
    if not rows:
        raise ValueError("the runs hold no single-engine overload run (their saturation rates were taken "
                         "--saturation-from another run)")
    key = lambda row: (row.host, row.scheduler, row.mix, row.date, row.commit)  # noqa: E731
    new = {key(row) for row in rows}
    kept = [row for row in (profile.hosts.runs if profile.hosts else ()) if key(row) not in new]
    return profile.with_hosts(HostSpread(tuple(kept + rows)))


def with_path_levels(profile, measured: tuple[Path, ...], hosts: dict[Path, str], paths: tuple[str, ...] = (),
                     growth: bool = False, per_sample: bool = False, samplers: dict[Path, str] | None = None,
                     attention: bool = True):
    """``profile`` with its serving paths' levels at the median host of the ``measured`` runs' warm-up and overload
    passes (``calibration.serving.fit_path_levels``; ``paths``: those to fit, default every one served), with
    ``growth`` their heat growth and prompt-attention scale first (``fit_path_growth``; without ``attention`` the
    growth alone, the section's attention scales kept), with ``per_sample`` the
    served step's work per sampled entry (``fit_step_per_sample``, after the growth), either on the cells' passes
    too, and those runs' hosts recorded again, since the levels move their simulated rates. A run of today's
    sampler has the section's ``sampler_saved`` put back on its steps (``serving_measurements``; ``samplers``: its
    ``--sampler-of``), since the levels scale the sweep's price."""
    from calibration.serving import fit_path_growth, fit_path_levels, fit_step_per_sample

    if profile.serving is None:
        raise ValueError("the profile has no serving section whose levels to move")
    bare = profile.with_serving(None)
    # the cells' passes too: they span the heat that overload runs, hot throughout, do not, and the batches between
    passes = [row for directory in measured
              for row in serving_measurements(directory, bare, hosts.get(directory), cells=growth or per_sample,
                                              heat_tau_s=profile.serving.heat_tau_s,
                                              sampler_saved=profile.serving.sampler_saved_seconds,
                                              sampler=(samplers or {}).get(directory))[0]]
    serving = profile.serving.with_path_growth(*fit_path_growth(passes, profile.serving, paths,
                                                                attention=attention)) if growth else profile.serving
    if per_sample:
        serving = serving.with_step_per_sample(*fit_step_per_sample(passes, serving, paths))
    levels, fit = fit_path_levels(passes, serving, paths)
    moved = profile.with_serving(serving.with_path_levels(levels, fit)).with_hosts(profile.hosts)
    return with_measured_hosts(moved, measured, hosts)


def with_loop(profile, measured: tuple[Path, ...], hosts: dict[Path, str], cells: bool = False):
    """``profile`` with its serving loop's line refitted on the ``measured`` runs' warm-up and overload passes
    (``calibration.serving.fit_loop``, each host weighing as one), or with ``cells`` on their cells' passes alone,
    the rest of the section kept, and those runs' hosts recorded again, since the loop moves their simulated
    rates. The cells are what a section judged on other runs should see: an overload run, sent at several times
    the engine's rate, runs its loop slower than a cell below saturation at the same batch."""
    from calibration.serving import fit_loop

    if profile.serving is None:
        raise ValueError("the profile has no serving section whose loop to refit")
    bare = profile.with_serving(None)
    passes = [row for directory in measured
              for row in serving_measurements(directory, bare, hosts.get(directory), cells=cells,
                                              calibration=not cells, heat_tau_s=profile.serving.heat_tau_s)[0]]
    per_pass, per_sample, knee, above, fit = fit_loop(passes)
    serving = profile.serving.with_loop(per_pass, per_sample, knee, above,
                                        {**fit, "source": "cells" if cells else "warm-up and overload runs"})
    return with_measured_hosts(profile.with_serving(serving).with_hosts(profile.hosts), measured, hosts)


def with_bucket_scales(profile, measured: tuple[Path, ...], hosts: dict[Path, str],
                       samplers: dict[Path, str] | None = None):
    """``profile`` with its mixed paths' factors per graph bucket (``calibration.serving.fit_bucket_scales``) around
    the section's levels, which stay, measured on the ``measured`` runs' warm-up, overload and cell passes (the
    small buckets are a prompt's remainder, a few a run), and those runs' hosts recorded again. A section whose
    buckets were filled from the sweep has those the runs lack filled again (``with_served_buckets``)."""
    from calibration.serving import fit_bucket_scales
    from calibration.sweep_buckets import with_served_buckets

    if profile.serving is None:
        raise ValueError("the profile has no serving section whose paths to price per bucket")
    bare = profile.with_serving(None)
    passes = [row for directory in measured
              for row in serving_measurements(directory, bare, hosts.get(directory), cells=True,
                                              heat_tau_s=profile.serving.heat_tau_s,
                                              sampler_saved=profile.serving.sampler_saved_seconds,
                                              sampler=(samplers or {}).get(directory))[0]]
    profile = with_served_buckets(profile, *fit_bucket_scales(passes, profile.serving))
    return with_measured_hosts(profile, measured, hosts)


def with_step_knee(profile, measured: tuple[Path, ...], hosts: dict[Path, str], knee: float,
                   samplers: dict[Path, str] | None = None):
    """``profile`` with what its graph steps save past ``knee`` sampled entries (``calibration.serving.
    fit_step_knee``), measured on the ``measured`` runs' sampled warm-up and overload passes (only those reach such
    batches), each host weighing as one, the rest of the section kept, and those runs' hosts recorded again. A run
    of today's sampler has the section's ``sampler_saved`` put back on its steps, as the section prices them."""
    from calibration.serving import fit_step_knee

    if profile.serving is None:
        raise ValueError("the profile has no serving section whose steps to price past a knee")
    bare = profile.with_serving(None)
    passes = [row for directory in measured
              for row in serving_measurements(directory, bare, hosts.get(directory),
                                              heat_tau_s=profile.serving.heat_tau_s,
                                              sampler_saved=profile.serving.sampler_saved_seconds,
                                              sampler=(samplers or {}).get(directory))[0]]
    serving = profile.serving.with_step_knee(knee, *fit_step_knee(passes, profile.serving, knee))
    return with_measured_hosts(profile.with_serving(serving).with_hosts(profile.hosts), measured, hosts)


def _folder_name(directory: Path) -> str:
    return directory.name or directory.resolve().name  # "." has no name of its own


def _check_run_model(directory: Path, cost) -> None:
    """ValueError where the --from run ``directory`` served another model than the measured profile ``cost``
    prices: its passes and overload runs would be priced, fitted and recorded as the wrong model's."""
    meta_file = directory / "meta.json"
    served = json.loads(meta_file.read_text()).get("model") if meta_file.exists() else None
    priced = cost.meta.get("model")
    if served and priced and served != priced:
        raise ValueError(f"--from {directory} served {served}, but the profile prices {priced}")


def _cpus(flag: str, text: str | None) -> frozenset[int] | None:
    """The CPUs of ``flag``'s list, each one this process may run on; None where not given."""
    if text is None:
        return None
    cpus = parse_cpu_list(text)
    missing = cpus - os.sched_getaffinity(0)
    if missing:
        raise ValueError(f"{flag} {text}: CPUs {format_cpu_list(missing)} are not among this machine's "
                         f"({format_cpu_list(os.sched_getaffinity(0))})")
    return cpus


def _run_labels(flag: str, specs: tuple[str, ...], measured: tuple[Path, ...], example: str,
                choices: tuple[str, ...] = ()) -> dict[Path, str]:
    """{--from run: its label} of ``flag DIR=LABEL`` options (``--host-of``, ``--sampler-of``), each label one of
    ``choices`` where given."""
    runs = {run.resolve(): run for run in measured}
    labels = {}
    for spec in specs:
        directory, _, label = spec.rpartition("=")
        if not directory or not label:
            raise ValueError(f"{flag} {spec!r}: expected DIR=LABEL, e.g. {example}")
        if choices and label not in choices:
            raise ValueError(f"{flag} {spec!r}: {label!r} is not one of {', '.join(choices)}")
        run = runs.get(Path(directory).resolve())
        if run is None:
            raise ValueError(f"{flag} {spec!r}: {directory} is not one of the --from runs")
        labels[run] = label
    return labels


def _judged(errors) -> str:
    return ", ".join(f"{view} {int(part.in_bounds.sum())} of {len(part)}"
                     for view, part in errors.groupby("view", sort=False))


def _fitted(flag: str, path: Path, fit, *args):
    """``fit(*args)``, a profile, saved to ``path``; its ValueError as the error of ``flag``."""
    import click

    try:
        profile = fit(*args)
    except ValueError as e:
        raise click.ClickException(f"{flag}: {e}") from None
    return saved(profile, path)


def saved(profile, path: Path):
    """``profile`` with its measured hosts simulated again on it (``rehosted``), saved to ``path``."""
    profile = rehosted(profile)
    profile.save(path)
    return profile


def _command():
    import click

    from engine.config import EngineConfig
    from engine.policy.options import config_options, pick

    @click.command()
    @click.argument("model", required=False)
    @click.option("--profile", required=True, help="The card's profile (shipped name or path) to simulate with.")
    @click.option("--scheduler", "schedulers", multiple=True, default=("splitfuse:768",), show_default=True,
                  help="NAME[:TOKEN_BUDGET]; repeat for several.")
    @click.option("--mix", "mixes", multiple=True, default=("long",), show_default=True,
                  help=f"Workload mix: one of {', '.join(MIXES)}, or NAME=PROMPT/OUTPUT lengths "
                       "(e.g. tiny=uniform:8:32/fixed:6); repeat for several.")
    @click.option("--loads", default=None, help="Open-loop loads, shares of the measured saturation rate: 0.25,0.5")
    @click.option("--clients", default=None, help="Closed-loop client counts: 1,2,4,8")
    @click.option("--max-concurrency", "caps", default="0", show_default=True,
                  help="Run each open-loop cell at each of these caps on requests in flight (vLLM's bench "
                       "--max-concurrency; 0: none): 0,16")
    @click.option("--temperature", type=click.FloatRange(min=0), default=1.0, show_default=True,
                  help="Every request's sampling temperature (0: greedy, whose decode steps the engine enqueues "
                       "ahead; the simulator prices them so where the profile measured greedy serving).")
    @click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
                  help="Engines, one GPU each, behind `splitfuse serve`'s router (and as many simulated).")
    @click.option("--balancer", "balancers", multiple=True,
                  help="The router's balancer with --replicas > 1; repeat for several (one fleet, a router each; "
                       f"default {PolicyConfig().balancer}).")
    @click.option("--saturation-from", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                  help="Take the measured saturation rates of an earlier run (its --out) instead of measuring them; "
                       "a fleet's loads are shares of --replicas times one engine's rate.")
    @click.option("--num-requests", "-n", type=click.IntRange(min=1), default=300, show_default=True)
    @click.option("--cell-seconds", type=click.FloatRange(min=1), default=None,
                  help="Cap an open-loop cell at rate x this many seconds of requests (at least 50).")
    @click.option("--workload-seed", type=int, default=0, show_default=True, help="Seed of the workloads.")
    @click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
                  help="Run the grid this many times over on the same requests (fresh prompt tokens) and also "
                       "compare the simulator with each cell's mean (errors_repeats.csv, with the repeats' spread).")
    @click.option("--warmup", type=click.IntRange(min=0), default=64, show_default=True,
                  help="Requests of a warm-up workload before any measured one (kernels compile).")
    @click.option("--client-processes", type=click.IntRange(min=1), default=4, show_default=True)
    @click.option("--server-cpus", default=None, metavar="LIST",
                  help="CPUs the server's processes (API, engine, a fleet's router) run on, as taskset lists them "
                       "(0-7,16-23; `python -m sim.cpu_sets` splits a machine's cores); default: any.")
    @click.option("--client-cpus", default=None, metavar="LIST",
                  help="CPUs the clients run on (this process while it measures); give --server-cpus other "
                       "physical cores, so that the clients' work does not slow the engine's loop.")
    @click.option("--time-budget", type=click.FloatRange(min=1), default=None,
                  help="Seconds after which no further cell begins (the servers then stop and write their traces).")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
    @click.option("--from", "measured", type=click.Path(file_okay=False, exists=True, path_type=Path), multiple=True,
                  help="Compare the measurements of an earlier run (its --out) instead of measuring: no MODEL. "
                       "Repeat for several runs: each is compared into --out/<its folder's name>, and "
                       "--fit-serving pools their warm-up and overload runs, each host weighing as one.")
    @click.option("--host-of", "host_labels", multiple=True, metavar="DIR=LABEL",
                  help="Label the host of a --from run that recorded none (older runs; each otherwise counts "
                       "as its own host). Repeat for several.")
    @click.option("--sampler-of", "sampler_labels", multiple=True, metavar="DIR=DRAW",
                  help="How the engine of a --from run that recorded none drew its sampled tokens: sort or "
                       "vocab-order (engine.config.SAMPLER_DRAWS; unrecorded: sort). --fit-levels and "
                       "--fit-buckets put the profile's sampler_saved back on a vocab-order run's steps. Repeat "
                       "for several.")
    @click.option("--fit-serving", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Fit the serving loop's cost per pass on the traced passes outside the cells (warm-up, "
                       "overload runs), write the profile with it to this file and compare with that.")
    @click.option("--record-hosts", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the profile with the runs' hosts added to its measured hosts: each overload run's "
                       "sustained rate, served and simulated (the spread `splitfuse plan` plans for). "
                       "--fit-serving records its runs' hosts itself.")
    @click.option("--fit-noise", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the profile with the spread of its served passes around their price, measured on the "
                       "runs' warm-up and overload passes (each host weighing as one), which the simulator then "
                       "draws pass times from instead of the sweep's repeats; compare with that. With --fit-serving "
                       "it measures the new section and records the runs' hosts again; else the profile's hosts "
                       "are kept (add --record-hosts to record these runs' again).")
    @click.option("--fit-levels", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the profile with serving paths' levels (scales at heat 0) moved to the median host of "
                       "the runs' warm-up and overload passes, each host weighing as one, the heat growth and the "
                       "rest of the section kept; records the runs' hosts again and compares with that.")
    @click.option("--level-path", "level_paths", multiple=True,
                  help="With --fit-levels, a path whose level to fit (e.g. eager-prefill); repeat for several "
                       "(default: every path the runs served).")
    @click.option("--level-growth", is_flag=True,
                  help="With --fit-levels, first fit those paths' growth with heat and their prompts' attention "
                       "over prefixes (each the median over the hosts whose passes show it, the cells' passes "
                       "included: judge the result on other runs), then their levels at it: for a section fitted "
                       "on hosts that could not show them.")
    @click.option("--keep-attention", is_flag=True,
                  help="With --level-growth, fit the paths' heat growth alone, keeping the section's prompt-"
                       "attention scales: for runs whose hosts disagree on attention, or whose prompts span few "
                       "prefixes (decode-first runs whole prompts).")
    @click.option("--level-per-sample", is_flag=True,
                  help="With --fit-levels, first fit the served step's work per sampled entry beyond the sweep's "
                       "price (the median over hosts, the cells' passes included: judge the result on other runs), "
                       "then the levels at it: for cards whose served step grows with the batch faster than the "
                       "sweep's.")
    @click.option("--fit-loop", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the profile with its serving loop's line (per pass, per sampled entry, knee) refitted "
                       "on the runs' warm-up and overload passes, each host weighing as one, the rest of the "
                       "section kept; records the runs' hosts again and compares with that (before --fit-levels "
                       "where both are given).")
    @click.option("--loop-cells", is_flag=True,
                  help="With --fit-loop, fit the line on the runs' cells alone instead (judge the result on other "
                       "runs): an overload run, sent at several times the engine's rate, runs its loop slower than "
                       "the cells below saturation do at the same batch.")
    @click.option("--fit-buckets", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the profile with its mixed-graph paths priced per graph bucket: each bucket's factor "
                       "on the path's scale, the shape that each host's median of served / priced per bucket "
                       "shows once its own offset is taken out (hosts of other budgets share it), scaled so that a "
                       "host's typical pass keeps its price (the cells' passes included: judge the result on other "
                       "runs), the levels and the rest of the section kept; records the runs' hosts again and "
                       "compares with that.")
    @click.option("--fit-step-knee", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the profile with what its graph steps save past --step-knee sampled entries, per path "
                       "(at the knee and per entry beyond), measured on the runs' sampled warm-up and overload "
                       "passes, each host weighing as one, the rest of the section kept; records the runs' hosts "
                       "again and compares with that (after --fit-levels where both are given).")
    @click.option("--step-knee", type=click.IntRange(min=1), default=None,
                  help="With --fit-step-knee, the sampled entries past which a step saves (default 128).")
    @click.option("--fit-greedy", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the profile with its greedy graph passes priced (one on its own or a decode step "
                       "enqueued ahead: its price less what it saves, the sampling it skips and the host work it "
                       "hides, a line in its sampled entries; what one discarded adds: a share of its price), "
                       "measured on the runs' warm-up and overload runs sent at --temperature 0, each host weighing "
                       "as one; compare with that.")
    @click.option("--greedy-cells", is_flag=True,
                  help="With --fit-greedy, fit on the runs' greedy cells alone instead (judge the result on other "
                       "runs): an overload run's steps ahead run at larger batches than a cell's below saturation.")
    @click.option("--exclude-first-requests", is_flag=True,
                  help="Leave each client's first request (each client process's, in open loop) out of both sides: "
                       "for runs sent before the client warmed up, whose first requests carried its start-up.")
    @click.option("--host-margin", type=click.FloatRange(min=0, max=1, max_open=True), default=0.0,
                  show_default=True,
                  help="Simulate on a host whose passes run this share slower than the profile's (0.028: 2.8%; a "
                       "host's factor in the profile's hosts section, less 1).")
    @click.option("--host-from-overload", is_flag=True,
                  help="Simulate each run on its own host: each serving path's passes slowed by the factor its "
                       "overload runs show (served / predicted loop time, passes outside every cell; decode steps "
                       f"of up to {OVERLOAD_DECODE_MAX_SEQS} sequences), a fleet's engines each by their own; the "
                       "factors go to host_factors.json (a list, one per engine). Needs a measured profile; not "
                       "with --host-margin.")
    @click.option("--host-typical", is_flag=True,
                  help="Simulate each cell on the typical measured host of the profile's card for its mix and "
                       "scheduler (the geometric mean of the overload runs its hosts section records, the run's "
                       "own host left out: label it with --host-of as it was recorded). Not with --host-margin or "
                       "--host-from-overload.")
    @click.option("--sim-seeds", type=click.IntRange(min=1), default=1, show_default=True,
                  help="Also simulate each cell on this many seeds and write the spread (sim_seeds.csv).")
    @config_options(EngineConfig)
    def validate(model, profile, schedulers, mixes, loads, clients, caps, temperature, replicas, balancers,
                 saturation_from,
                 num_requests, cell_seconds, workload_seed, repeats, warmup, client_processes, server_cpus,
                 client_cpus, time_budget, out,
                 measured, host_labels, sampler_labels, fit_serving, fit_noise, fit_levels, level_paths,
                 level_growth, keep_attention, level_per_sample, fit_step_knee, step_knee, fit_greedy, greedy_cells,
                 fit_loop, loop_cells, fit_buckets, record_hosts,
                 exclude_first_requests,
                 host_margin, host_from_overload, host_typical, sim_seeds, **engine_options):
        """Run workloads on the real engine behind its server and through the simulator; compare them."""
        from calibration.profile import Profile
        from calibration.serving import fit_serving as fit
        from sim.costs import load_cost_model

        try:
            cost = load_cost_model(profile)
            if len({_folder_name(m) for m in measured}) < len(measured):
                raise ValueError("--from: runs compared together need folders of distinct names")
            hosts = _run_labels("--host-of", host_labels, measured, "runs/a=host-9")
            samplers = _run_labels("--sampler-of", sampler_labels, measured, "runs/a=vocab-order", SAMPLER_DRAWS)
            cpus = {flag: _cpus(flag, text) for flag, text in (("--server-cpus", server_cpus),
                                                               ("--client-cpus", client_cpus))}
            if measured and (server_cpus or client_cpus):
                raise ValueError("--server-cpus and --client-cpus are for measuring; drop them with --from")
            for directory in measured if isinstance(cost, Profile) else ():
                _check_run_model(directory, cost)
            if not measured:
                if not model:
                    raise ValueError("give MODEL to measure, or --from DIR to compare an earlier run")
                cells = make_cells(_schedulers(schedulers), mixes, _numbers(loads, "--loads"),
                                   _numbers(clients, "--clients", int), num_requests, workload_seed, replicas,
                                   balancers, repeats, _caps(caps), temperature)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        for flag, given in (("--fit-serving", fit_serving), ("--record-hosts", record_hosts),
                            ("--fit-noise", fit_noise), ("--fit-levels", fit_levels), ("--fit-greedy", fit_greedy),
                            ("--fit-loop", fit_loop), ("--fit-buckets", fit_buckets),
                            ("--fit-step-knee", fit_step_knee)):
            if given and not isinstance(cost, Profile):
                raise click.UsageError(f"{flag} needs a measured profile (--profile NAME|FILE)")
        if host_from_overload and not isinstance(cost, Profile):
            raise click.UsageError("--host-from-overload needs a measured profile (--profile NAME|FILE)")
        if host_from_overload and host_margin:
            raise click.UsageError("--host-from-overload measures each run's host; drop --host-margin")
        if host_typical and (host_margin or host_from_overload):
            raise click.UsageError("--host-typical picks each cell's host; drop --host-margin and --host-from-overload")
        if host_typical and not (getattr(cost, "hosts", None) and cost.hosts.active):
            raise click.UsageError("--host-typical needs a measured profile whose hosts section holds active runs "
                                   "(--record-hosts)")
        for flag, given in (("--level-path", level_paths), ("--level-growth", level_growth),
                            ("--level-per-sample", level_per_sample)):
            if given and not fit_levels:
                raise click.UsageError(f"{flag} is for --fit-levels; give --fit-levels FILE")
        if keep_attention and not level_growth:
            raise click.UsageError("--keep-attention is for --level-growth; give --fit-levels FILE --level-growth")
        if loop_cells and not fit_loop:
            raise click.UsageError("--loop-cells is for --fit-loop; give --fit-loop FILE")
        if greedy_cells and not fit_greedy:
            raise click.UsageError("--greedy-cells is for --fit-greedy; give --fit-greedy FILE")
        if step_knee is not None and not fit_step_knee:
            raise click.UsageError("--step-knee is for --fit-step-knee; give --fit-step-knee FILE")
        if fit_serving and record_hosts:
            raise click.UsageError("--fit-serving records its runs' hosts in its profile; drop --record-hosts")
        if not measured:
            saturation = json.loads((saturation_from / "meta.json").read_text())["saturation_rps"] \
                if saturation_from else None
            measure(model, cells, out, pick(EngineConfig, engine_options), cost, warmup, client_processes,
                    cell_seconds=cell_seconds, time_budget=time_budget, saturation=saturation,
                    server_cpus=cpus["--server-cpus"], client_cpus=cpus["--client-cpus"], progress=click.echo)
            measured = (out,)
        if fit_serving:
            bare = cost.with_serving(None)
            passes, requests = [], []
            for directory in measured:
                more_passes, more_requests = serving_measurements(directory, bare, hosts.get(directory))
                passes.extend(more_passes)
                requests.extend(more_requests)
            try:
                serving = fit(passes, requests, {"traced": ", ".join(map(str, measured))})
            except ValueError as e:
                raise click.ClickException(f"--fit-serving: {e}") from None
            try:
                cost = with_measured_hosts(bare.with_serving(serving), measured, hosts)
            except ValueError as e:
                raise click.ClickException(f"--fit-serving: {e}") from None
            cost = saved(cost, fit_serving)
            fit_ = serving.fit
            knee = (f" (+ {serving.per_sample_above_knee_s * 1e6:.2f} us past {serving.loop_knee:.0f})"
                    if serving.per_sample_above_knee_s else "")
            click.echo(f"serving: loop {serving.per_pass_s * 1e3:.3f} ms a pass + {serving.per_sample_s * 1e6:.2f} "
                       f"us a sampled entry{knee}; admission median {fit_['admission']['p50_s'] * 1e3:.2f} ms (mean "
                       f"{fit_['admission']['mean_s'] * 1e3:.2f}; {serving.admission_per_token_s * 1e6:.3f} us a "
                       f"prompt token); delivery {serving.delivery_seconds(0) * 1e3:.2f} ms + "
                       f"{serving.delivery_per_sample_s * 1e6:.2f} us a sampled entry; served/swept "
                       f"step {serving.path_scale}; wrote {fit_serving}")
        if fit_noise:
            try:
                cost = with_served_noise(cost, measured, hosts)
                if fit_serving:  # the spread moves the simulated rates its runs' hosts were judged by
                    cost = with_measured_hosts(cost, measured, hosts)
            except ValueError as e:
                raise click.ClickException(f"--fit-noise: {e}") from None
            cost = saved(cost, fit_noise)
            noise = cost.serving.fit["noise"]
            click.echo(f"served passes over their price, each run over its median ({noise['hosts']} hosts, "
                       f"{noise['passes']} passes): mean {noise['mean']:.4f}, p10 {noise['p10']:.4f}, p90 "
                       f"{noise['p90']:.4f}, p99 {noise['p99']:.4f}; wrote {fit_noise}")
        if fit_loop:
            cost = _fitted("--fit-loop", fit_loop, with_loop, cost, measured, hosts, loop_cells)
            s, before = cost.serving, cost.serving.fit["loop"]["before"]
            click.echo(f"serving loop: {before['per_pass_s'] * 1e3:.3f} -> {s.per_pass_s * 1e3:.3f} ms a pass, "
                       f"{before['per_sample_s'] * 1e6:.2f} -> {s.per_sample_s * 1e6:.2f} us a sampled entry, knee "
                       f"{before['loop_knee']:.0f} -> {s.loop_knee:.0f} (+ {s.per_sample_above_knee_s * 1e6:.2f} us "
                       f"past it; {cost.serving.fit['loop'].get('hosts', 1)} hosts, "
                       f"{cost.serving.fit['loop']['source']}); wrote {fit_loop}")
        if fit_levels:
            try:
                cost = with_path_levels(cost, measured, hosts, level_paths, level_growth, level_per_sample,
                                        samplers, attention=not keep_attention)
            except ValueError as e:
                raise click.ClickException(f"--fit-levels: {e}") from None
            cost = saved(cost, fit_levels)
            moved = ", ".join(f"{path} {fit['before']:.4f} -> {cost.serving.path_scale[path]:.4f} ({fit['hosts']} "
                              f"hosts)" for path, fit in cost.serving.fit["levels"].items())
            growth = cost.serving.fit.get("growth", {}) if level_growth else {}
            grown = "".join(f"; {path} heat {cost.serving.heat_scale[path]:.3f} (was {fit['heat_before']:.3f}, "
                            f"{fit['heat_hosts']} hosts), attention {cost.serving.attention_scale[path]:.3f} (was "
                            f"{fit['attention_before']:.3f})" for path, fit in growth.items())
            per_sample = (f"; the step {cost.serving.step_per_sample_s * 1e6:.2f} us a sampled entry (hosts "
                          + ", ".join(f"{h} {f['per_sample_s'] * 1e6:.2f}" for h, f in
                                      cost.serving.fit["step_per_sample"]["hosts"].items()) + ")"
                          if level_per_sample else "")
            click.echo(f"serving levels at heat 0, the hosts' median: {moved}{grown}{per_sample}; wrote {fit_levels}")
        if fit_step_knee:
            cost = _fitted("--fit-step-knee", fit_step_knee, with_step_knee, cost, measured, hosts,
                           STEP_KNEE if step_knee is None else step_knee, samplers)
            click.echo(f"graph steps past {cost.serving.step_knee:g} sampled entries save: " + "; ".join(
                f"{path} {saved['saved_s'] * 1e6:.0f} us + {saved['per_sample_s'] * 1e6:.2f} us an entry past it ("
                + ", ".join(f"{h} {f['saved_s'] * 1e6:.0f} + {f['per_sample_s'] * 1e6:.2f}"
                            for h, f in cost.serving.fit["step_knee"]["hosts"][path].items()) + ")"
                for path, saved in cost.serving.step_saved_past_knee.items()) + f"; wrote {fit_step_knee}")
        if fit_greedy:
            cost = _fitted("--fit-greedy", fit_greedy, with_greedy, cost, measured, hosts, greedy_cells)
            greedy, fit = cost.serving.greedy, cost.serving.fit["greedy"]
            click.echo("greedy decode-graph steps, the price less: " + ", ".join(
                f"{kind} {greedy[f'{kind}_saved_s'] * 1e3:.3f} ms + {greedy[f'{kind}_saved_per_sample_s'] * 1e6:.2f} "
                f"us a sampled entry ({fit[kind]['steps']} steps, {len(fit[kind]['hosts'])} hosts)"
                for kind in ("step", "ahead")) + f"; discarded, {greedy['discarded']:.4f} of its price added to the "
                f"next pass ({fit['discarded']['steps']} passes); wrote {fit_greedy}")
        if fit_buckets:
            cost = _fitted("--fit-buckets", fit_buckets, with_bucket_scales, cost, measured, hosts, samplers)
            click.echo("served / priced per graph bucket: " + "; ".join(
                f"{path} " + ", ".join(f"{b} {f:.3f}" for b, f in factors.items())
                for path, factors in cost.serving.bucket_scale.items()) + f"; wrote {fit_buckets}")
        if record_hosts:
            cost = _fitted("--record-hosts", record_hosts, with_measured_hosts, cost, measured, hosts)
        written = (record_hosts or fit_buckets or fit_step_knee or fit_levels or fit_loop
                   or fit_serving)  # the last one written
        if written:
            factors = ", ".join(f"{h} {f:.3f}" for h, f in cost.hosts.factors().items())
            click.echo(f"hosts, simulated / served requests/s: {factors}; margins "
                       f"{cost.hosts.describe_margins(cost.card_spread())}; "
                       f"wrote {written}")
        if host_margin:
            cost = SlowerHost(cost, 1 + host_margin)
        own_hosts = {directory: overload_path_factors(directory, cost) for directory in measured} \
            if host_from_overload else {}
        for directory, factors in own_hosts.items():
            if not any(factors):
                raise click.ClickException(f"--host-from-overload: {directory} traced no overload run with "
                                           f"{MIN_PATH_PASSES} passes of a serving path")
        for directory in measured:
            into = out if len(measured) == 1 else out / _folder_name(directory)
            host = cost
            if directory in own_hosts:
                factors = own_hosts[directory]
                host = [SlowerHost(cost, path_factors=engine) for engine in factors]
                into.mkdir(parents=True, exist_ok=True)
                (into / "host_factors.json").write_text(json.dumps(factors, indent=1) + "\n")
                for engine, paths in enumerate(factors):
                    card = f" engine {engine}" if len(factors) > 1 else ""
                    click.echo(f"{directory}: its host{card}, served / predicted loop time: "
                               + ", ".join(f"{path} {f:.3f}" for path, f in paths.items()))
            cell_cost = typical_cells(cost, directory, hosts.get(directory), click.echo) if host_typical else None
            compared = compare(directory, host, into, sim_seeds, exclude_first_requests, cell_cost)
            click.echo(f"cells within the bounds (errors.csv: in_bounds, misses): {_judged(compared['errors'])}")
            repeats = compared["repeats"]
            if repeats is not None:
                client = repeats[repeats.view == "client"]
                click.echo(f"each cell's mean of its repeats within the bounds (errors_repeats.csv): "
                           f"{_judged(repeats)}; the repeats' spread (client, median over cells): TPOT mean "
                           f"{client.tpot_mean_spread.median():.1%}, TTFT mean {client.ttft_mean_spread.median():.1%}")
            routing = compared["routing"]
            hop = router_hop(directory, cost) if routing is not None else None
            if hop is not None:
                line, mean_in, mean_out = hop
                click.echo(f"the router's hop over the profile's admission and first-token delivery: mean "
                           f"{mean_in * 1e3:.2f} ms in, {mean_out * 1e3:.2f} ms out; as lines over the streams open "
                           f"at the router, {line.describe()} (the simulator's {SERVE_ROUTER.describe()})")
            if routing is not None:
                size = routing[["ttft_mean", "tpot_mean", "e2e_mean"]].abs().groupby(routing.routes).mean()
                click.echo("fleet cells, mean |error| against the client with the balancer's routes / the measured "
                           "router's (routing.csv): " + ", ".join(
                               f"{metric} {size.at['balancer', metric]:.1%} / {size.at['measured', metric]:.1%}"
                               for metric in size.columns))
            click.echo(f"wrote {into}/validation.csv, errors.csv, passes.csv, delivery.csv, report.html")

    return validate


validate = _command()
