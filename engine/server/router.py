"""Replica router (FastGen's ``replica_num``): N engine processes behind one OpenAI-compatible endpoint.

The router picks a replica with ``engine.policy.load_balancer`` (the very policies the simulator's cluster uses),
checks each replica's ``/health`` and process, and takes a failing one out of rotation (``HEALTH_FAILURES`` checks
failed in a row, or at once a connection it refused, its process exiting, or a second dropped connection within
``DROPPED_S``). A replica process that exited (its engine died: ``splitfuse serve`` then exits 1) is restarted after
a backoff (1, 2, 4 ... 30 s, at most ``--max-replica-restarts`` times) and comes back once its health check passes.
A request whose kept-alive connection closed unanswered is sent to its replica once more on another connection
(``Router.open``). One that fails before the client received any token (connection refused or reset, or a 429/503
answer) is retried on another replica, or where none is left once more on one that only dropped its connection; a
stream that breaks after tokens were sent ends with an SSE error event and ``[DONE]``, never silently. On SIGTERM the
router stops taking requests and sends SIGTERM to its replicas, which drain as a single server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.config import EngineConfig
from engine.policy import PolicyConfig, ReplicaLoad, estimate_kv_usage, make_balancer
from engine.policy.options import config_flags
from engine.server.config import CLIENT_KEEPALIVE_EXPIRY_S, ServerConfig, stale_connection
from engine.server.guards import error_response, fastapi_options, install_guards
from engine.server.heap import freeze_startup_heap, unfreeze_heap
from engine.server.metrics import CONTENT_TYPE, ReplicaMetrics
from engine.server.protocol import APIError
from engine.server.workers import die_with_parent

RETRY_STATUSES = (429, 503)
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # before the 1st, 2nd, ... restart of a replica
# Health checks a running replica fails in a row before it leaves rotation (Kubernetes' failureThreshold): a replica
# whose API process is busy streaming can miss one check's timeout, and one slow answer is no reason to send all
# its share to the others. A request it fails, or its process exiting, takes it out at once.
HEALTH_FAILURES = 3
# A replica whose process is up and that drops a request's connection (a loaded machine: a kept-alive connection it
# closed, an accept backlog) stays in rotation and may take that request again on a fresh connection; a second drop
# within this many seconds takes it out, as a refused connection does at once.
DROPPED_S = 5.0


@dataclass
class Replica:
    index: int
    url: str
    process: subprocess.Popen | None = None
    command: list[str] | None = None  # how to start it again (a replica started here)
    env: dict | None = None
    healthy: bool = False
    dead: bool = False  # its process exited and its restarts are spent: out of rotation for good
    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    unstarted_tokens: int = 0  # prompt tokens of the requests sent that have streamed no token yet
    kv_usage: float = 0.0  # as the last health check reported it
    outstanding_at_report: int = 0  # outstanding_tokens then
    unstarted_at_report: int = 0  # unstarted_tokens then
    kv_capacity_tokens: int = 0
    failures: int = 0
    restarts: int = 0
    restart_at: float | None = None  # monotonic time of the next restart, while one is pending
    dropped_at: float = -math.inf  # monotonic time it last dropped a request's connection while its process was up

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(self.outstanding_requests, self.outstanding_tokens, estimate_kv_usage(
            self.kv_usage, self.outstanding_tokens, self.outstanding_at_report, self.kv_capacity_tokens,
            self.unstarted_at_report))

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, env=self.env, preexec_fn=die_with_parent)

    def info(self) -> dict:
        return {"index": self.index, "url": self.url, "healthy": self.healthy, "dead": self.dead,
                "restarts": self.restarts, "outstanding_requests": self.outstanding_requests,
                "outstanding_tokens": self.outstanding_tokens, "kv_usage": self.kv_usage}


class Sent:
    """A request sent to a replica, in that replica's load from the moment it is sent: outstanding until it finishes
    (``release``), its prompt unstarted until its first token is back (``start``)."""

    def __init__(self, replica: Replica, prompt_tokens: int, output_tokens: int) -> None:
        self.replica, self.prompt_tokens, self.tokens = replica, prompt_tokens, prompt_tokens + output_tokens
        self.started = False
        replica.outstanding_requests += 1
        replica.outstanding_tokens += self.tokens
        replica.unstarted_tokens += prompt_tokens

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.replica.unstarted_tokens -= self.prompt_tokens

    def release(self) -> None:
        self.start()
        self.replica.outstanding_requests -= 1
        self.replica.outstanding_tokens -= self.tokens


def estimate_tokens(raw: bytes) -> tuple[bool, int, int]:
    """(stream?, prompt tokens, requested output tokens) of a request body, roughly (4 characters a token)."""
    try:
        body = json.loads(raw)
        prompt = body.get("prompt", body.get("messages", ""))
        n = len(prompt) if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) \
            else len(json.dumps(prompt)) // 4
        return bool(body.get("stream")), n, int(body.get("max_tokens") or 16)
    except Exception:  # the replica answers the 400; here only the routing estimate is at stake
        return False, 0, 0


class Router:
    def __init__(self, replicas: list[Replica], balancer: str = "least-requests", seed: int = 0,
                 health_interval: float = 1.0, max_restarts: int = 5) -> None:
        self.replicas = replicas
        self.balancer = make_balancer(balancer, seed)
        self.health_interval = health_interval
        self.max_restarts = max_restarts
        self.retries = 0
        self.broken_streams = 0
        self.draining = False
        self.on_fatal = None  # unused: the router itself survives its replicas
        self.client: httpx.AsyncClient | None = None
        self.replica_metrics = ReplicaMetrics()
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.registry.register(self.replica_metrics)

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256,
                              keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=limits)

    async def stop(self) -> None:
        await self.client.aclose()

    # -- rotation --------------------------------------------------------------------------------------------
    def pick(self, exclude: set[int]) -> Replica | None:
        candidates = [r for r in self.replicas if r.healthy and r.index not in exclude]
        if not candidates:
            return None
        return candidates[self.balancer.choose([r.load() for r in candidates])]

    def retry(self, replica: Replica | None) -> Replica | None:
        """``replica`` (one every other candidate was tried before) if it is still in rotation."""
        return replica if replica is not None and replica.healthy else None

    def suspect(self, replica: Replica) -> None:
        """Out of rotation until a health check passes (after a restart, if its process has exited)."""
        replica.healthy = False

    def supervise(self, replica: Replica) -> None:
        """A replica whose process exited: restart it after its backoff, or give up after ``max_restarts``."""
        replica.healthy = False
        if self.draining or replica.dead or replica.command is None:
            return
        if replica.restarts >= self.max_restarts:
            replica.dead = True
            return
        now = time.monotonic()
        if replica.restart_at is None:
            replica.restart_at = now + BACKOFF_S[min(replica.restarts, len(BACKOFF_S) - 1)]
        elif now >= replica.restart_at:
            replica.restart_at = None
            replica.restarts += 1
            replica.start()

    def begin_drain(self, timeout: float) -> None:
        """Stop taking requests and restarting replicas; the replicas get SIGTERM and drain within their own
        ``--shutdown-timeout`` (the router's streams relay their last events)."""
        self.draining = True
        for r in self.replicas:
            if r.process is not None and r.process.poll() is None:
                r.process.terminate()

    async def check(self, replica: Replica) -> None:
        if replica.exited() or replica.dead:
            self.supervise(replica)
            return
        try:
            r = await self.client.get(replica.url + "/health", timeout=max(2.0, self.health_interval))
            ok = r.status_code == 200
            if ok:
                health = r.json()
                replica.kv_usage = float(health.get("kv_usage", 0.0))
                replica.outstanding_at_report = replica.outstanding_tokens
                replica.unstarted_at_report = replica.unstarted_tokens
                replica.kv_capacity_tokens = int(health.get("kv_capacity_tokens", 0))
        except (httpx.HTTPError, ValueError):
            ok = False
        replica.failures = 0 if ok else replica.failures + 1
        if ok or replica.failures >= HEALTH_FAILURES:
            replica.healthy = ok

    async def health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.check(r) for r in self.replicas))
            await asyncio.sleep(self.health_interval)

    # -- proxying --------------------------------------------------------------------------------------------
    async def proxy(self, request: Request, path: str) -> Response:
        if self.draining:
            return error_response(APIError("the server is shutting down", status=503, type="server_error"))
        raw = await request.body()
        stream, prompt_tokens, output_tokens = await asyncio.to_thread(estimate_tokens, raw) if len(raw) > 1 << 16 \
            else estimate_tokens(raw)
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        tried: set[int] = set()
        last = "no replica is healthy"
        again: Replica | None = None  # one that dropped a connection, still up: worth a fresh one, once
        while (replica := self.pick(tried) or self.retry(again)) is not None:
            again = None if replica is again else again
            tried.add(replica.index)
            sent = Sent(replica, prompt_tokens, output_tokens)

            try:
                resp = await self.open(replica.url + path, raw, headers)
            except httpx.TransportError as e:
                sent.release()
                now = time.monotonic()
                if isinstance(e, httpx.ConnectError) or replica.exited() or now - replica.dropped_at < DROPPED_S:
                    self.suspect(replica)  # nothing listens, or it keeps dropping connections
                else:  # one dropped connection of a replica whose process is up (a busy moment): it stays
                    replica.dropped_at, again = now, replica
                last, self.retries = f"replica {replica.index} unreachable: {e!r}", self.retries + 1
                continue
            streaming = stream and resp.status_code == 200
            try:
                if streaming:
                    chunks = resp.aiter_raw()
                    first = await chunks.__anext__()  # nothing reached the client yet: still retryable
                    sent.start()
                else:
                    content = await resp.aread()
            except (httpx.TransportError, StopAsyncIteration) as e:
                await resp.aclose()
                sent.release()
                self.suspect(replica)
                last, self.retries = f"replica {replica.index} failed before answering: {e!r}", self.retries + 1
                continue
            except BaseException:
                await resp.aclose()
                sent.release()
                raise
            if not streaming:
                await resp.aclose()
                sent.release()
                if resp.status_code in RETRY_STATUSES and len(tried) < len(self.replicas):
                    last, self.retries = f"replica {replica.index} answered {resp.status_code}", self.retries + 1
                    continue
                return Response(content, status_code=resp.status_code, media_type=resp.headers.get("content-type"))
            relay = self._relay(replica, resp, first, chunks, sent.release)
            return StreamingResponse(relay, media_type="text/event-stream")
        err = APIError(f"no replica could serve the request (tried {len(tried)}): {last}", status=503,
                       type="server_error")
        return JSONResponse(err.body(), status_code=503)

    async def open(self, url: str, raw: bytes, headers: dict) -> httpx.Response:
        """POST ``raw`` to ``url``, its answer streamed; sent once more where a kept-alive connection closed before
        answering (``stale_connection``: says nothing of the replica, which keeps the request)."""
        for last_try in (False, True):
            try:
                return await self.client.send(self.client.build_request("POST", url, content=raw, headers=headers),
                                              stream=True)
            except httpx.TransportError as e:
                if last_try or not stale_connection(e):
                    raise
                self.retries += 1

    async def _relay(self, replica: Replica, resp: httpx.Response, first: bytes, chunks, release):
        try:
            yield first
            async for chunk in chunks:
                yield chunk
        except httpx.TransportError as e:
            self.suspect(replica)
            self.broken_streams += 1
            err = APIError(f"replica {replica.index} failed mid-stream after tokens were sent ({e!r}); the "
                           f"request was not completed and cannot be retried transparently", status=502,
                           type="server_error")
            yield f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
        finally:
            release()
            await resp.aclose()

    def collect(self):
        """The router's own metrics (a prometheus_client collector): per replica, and retries/broken streams."""
        for name, help, get in (
                ("healthy", "1 when the replica is in rotation.", lambda r: int(r.healthy)),
                ("restarts", "Times the replica was restarted.", lambda r: r.restarts),
                ("outstanding_requests", "Requests sent and not finished.", lambda r: r.outstanding_requests),
                ("outstanding_tokens", "Prompt + requested tokens outstanding.", lambda r: r.outstanding_tokens),
                ("kv_usage", "KV use at the last health check.", lambda r: r.kv_usage)):
            g = GaugeMetricFamily(f"splitfuse_router_replica_{name}", help, labels=["replica"])
            for r in self.replicas:
                g.add_metric([str(r.index)], get(r))
            yield g
        yield CounterMetricFamily("splitfuse_router_retries", "Requests sent again (on another replica, or on a "
                                  "fresh connection where a kept-alive one closed unanswered).",
                                  value=self.retries)
        yield CounterMetricFamily("splitfuse_router_broken_streams", "Streams cut by a replica failure mid-stream.",
                                  value=self.broken_streams)

    async def render_metrics(self) -> str:
        """The router's metrics and every live replica's (scraped now), labelled ``replica``."""

        async def scrape(r: Replica) -> None:
            try:
                self.replica_metrics.texts[r.index] = (await self.client.get(r.url + "/metrics", timeout=5)).text
            except httpx.HTTPError:
                self.replica_metrics.texts.pop(r.index, None)

        await asyncio.gather(*(scrape(r) for r in self.replicas if not r.dead and not r.exited()))
        return generate_latest(self.registry).decode()


def create_router_app(router: Router, config: ServerConfig | None = None) -> FastAPI:
    """The router's app, with the same limits, auth and CORS as a single server (``config``)."""
    config = config or ServerConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.start()
        await asyncio.gather(*(router.check(r) for r in router.replicas))
        task = asyncio.create_task(router.health_loop())
        freeze_startup_heap()
        yield
        task.cancel()
        await router.stop()
        unfreeze_heap()

    app = FastAPI(title="splitfuse router", lifespan=lifespan, **fastapi_options(config))
    app.state.router = router
    install_guards(app, config)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await router.proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await router.proxy(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models():
        for replica in router.replicas:
            if replica.healthy:
                with contextlib.suppress(httpx.HTTPError):
                    r = await router.client.get(replica.url + "/v1/models")
                    return Response(r.content, status_code=r.status_code, media_type="application/json")
        return error_response(APIError("no replica is healthy", status=503, type="server_error"))

    @app.get("/health")
    async def health():
        ok = any(r.healthy for r in router.replicas)
        return JSONResponse({"status": "ok" if ok else "error", "replicas": [r.info() for r in router.replicas]},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(await router.render_metrics(), media_type=CONTENT_TYPE)

    return app


# -- replica processes -------------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def replica_slots(device: str, replicas: int) -> list[dict]:
    """Per-replica environment: one GPU each when the engine runs on GPUs, else a CPU slot."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device != "cpu":
        if visible is not None:
            gpus = [g for g in visible.split(",") if g.strip()]
        else:
            try:
                out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
                gpus = [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU")]
            except (OSError, subprocess.SubprocessError):
                gpus = []
        if gpus:
            if len(gpus) < replicas:
                raise ValueError(f"--replicas {replicas} needs one GPU each but {len(gpus)} are visible")
            return [{"CUDA_VISIBLE_DEVICES": gpus[i]} for i in range(replicas)]
    return [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(replicas)]


def start_replicas(config: EngineConfig, name: str, replicas: int, threads: int | None, log_level: str,
                   max_waiting: int, engine_process: bool = True, http: ServerConfig | None = None) -> list[Replica]:
    """One ``splitfuse serve`` process per replica (one GPU each, or a CPU slot), every one built from ``config``;
    ``http``'s limits and shutdown timeout apply to each (its auth and CORS stay with the router)."""
    threads = threads or max(1, (os.cpu_count() or 1) // replicas)
    http = dataclasses.replace(http or ServerConfig(), api_key=None)
    flags = config_flags(PolicyConfig, vars(config.policy)) + config_flags(EngineConfig, vars(config)) + \
        config_flags(ServerConfig, {k: v for k, v in vars(http).items() if not k.startswith("allow")})
    out = []
    for i, env in enumerate(replica_slots(config.device, replicas)):
        port = free_port()
        cmd = [sys.executable, "-m", "engine.server.cli", config.model, "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", name, "--max-waiting", str(max_waiting), "--threads", str(threads),
               "--log-level", log_level, "--engine-process" if engine_process else "--no-engine-process", *flags]
        replica = Replica(i, f"http://127.0.0.1:{port}", command=cmd, env={**os.environ, **env})
        replica.start()
        out.append(replica)
    return out


def wait_healthy(replicas: list[Replica], timeout: float) -> None:
    """Block until every replica answers /health (raise if one exits or the time runs out)."""
    deadline = time.monotonic() + timeout
    pending = list(replicas)
    while pending:
        for r in list(pending):
            if r.process is not None and r.process.poll() is not None:
                raise RuntimeError(f"replica {r.index} exited with code {r.process.returncode} while starting")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(r.url + "/health", timeout=1.0).status_code == 200:
                    pending.remove(r)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"replicas {[r.index for r in pending]} not healthy after {timeout:.0f} s")
        time.sleep(0.2)


def stop_replicas(replicas: list[Replica], timeout: float = 10.0) -> None:
    """Stop the replica processes started here (a replica given by URL has none): SIGTERM, then SIGKILL after
    ``timeout`` seconds."""
    replicas = [r for r in replicas if r.process is not None]
    for r in replicas:
        if r.process.poll() is None:
            r.process.terminate()
    deadline = time.monotonic() + timeout
    for r in replicas:
        try:
            r.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.process.kill()
            r.process.wait()


def run_router(config: EngineConfig, name: str, host: str, port: int, replicas: int, threads: int | None,
               log_level: str, max_waiting: int, startup_timeout: float = 600,
               engine_process: bool = True, replica_urls: tuple[str, ...] = (),
               http: ServerConfig | None = None) -> None:
    """Start the replica processes, serve the router (balancing with ``config.policy.balancer``, checking the
    replicas' health and KV usage every ``config.policy.kv_report_interval`` seconds, restarting dead ones) until
    SIGTERM (then drain), and stop the replicas. With ``replica_urls``, route to those running servers instead
    (they are neither started nor stopped here)."""
    from engine.server.http import run_http

    http = http or ServerConfig()
    # uvicorn re-raises SIGTERM after its shutdown; exiting by SystemExit lets ``finally`` stop the replicas
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if replica_urls:
        procs = [Replica(i, url.rstrip("/")) for i, url in enumerate(replica_urls)]
    else:
        procs = start_replicas(config, name, replicas, threads, log_level, max_waiting, engine_process, http)
    try:
        wait_healthy(procs, startup_timeout)
        router = Router(procs, config.policy.balancer, seed=config.seed,
                        health_interval=config.policy.kv_report_interval, max_restarts=http.max_replica_restarts)
        run_http(create_router_app(router, http), host, port, log_level, http, service=router)
    finally:
        stop_replicas(procs, timeout=http.shutdown_timeout + 10)
