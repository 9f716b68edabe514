"""``splitfuse bench`` against the real server (tiny model): open and closed loop, the simulator's table, and
the metric columns checked on hand-made timings."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from fastapi import Request  # at module level: the annotations below are strings, resolved in this module
from serving import serve_in_thread

from engine.server.app import create_app
from engine.server.engine_core import EngineSpec
from sim.bench import Record, to_result
from sim.bench_cli import bench
from sim.metrics import SLA, summarize

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def url():
    with serve_in_thread(create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=512, seed=0)), MODEL)) as url:
        yield url


def test_metric_columns_from_known_timings():
    # arrival 0, tokens at 1.0, 1.5, 2.0, 2.5 (4 tokens): ttft 1, e2e 2.5, tpot 0.5; the EWM of gaps is 0.5
    records = [Record(0, 1024, 4, arrival=0.0, chunk_times=[1.0, 1.5, 2.0, 2.5], output_tokens=4),
               Record(1, 10, 4, arrival=0.5, error="HTTP 503")]
    result = to_result(records, seed=0)
    row = result.requests.iloc[0]
    assert len(result.requests) == 1
    assert (row.ttft, row.e2e, row.tpot) == (1.0, 2.5, 0.5)
    assert row.max_ewm_gap == pytest.approx(0.5)
    s = summarize(result, SLA())
    assert s["requests"] == 1 and s["throughput_rps"] == pytest.approx(1 / 2.5)
    assert s["itl_p50"] == pytest.approx(0.5, rel=0.03)
    # prompt SLA 1024/512 = 2 s holds; generation SLA holds at 1 token/s (gap 0.5 < 1) but not at 2 (0.5 !< 0.5)
    assert s["sla_share@1"] == 1.0 and s["sla_share@2"] == 0.0


@pytest.mark.parametrize("args", [["--arrivals", "poisson", "--rate", "40"],
                                  ["--arrivals", "gamma", "--rate", "40", "--cv", "2"],
                                  ["--arrivals", "closed", "--clients", "4"],
                                  ["--request-rate", "40", "--max-concurrency", "2", "--client-processes", "2"]])
def test_bench_open_and_closed_loop(url, tmp_path, args):
    out = tmp_path / "run"
    result = CliRunner().invoke(bench, ["--base-url", url, "-n", "16", "--prompt-len", "uniform:8:40",
                                        "--output-len", "fixed:6", "--seed", "1", "--goodput", "ttft:30000",
                                        "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    for row in ("throughput", "TTFT p95", "TPOT p50", "inter-token latency p99", "end-to-end latency p99",
                "effective throughput (FastGen)", "goodput", "tokens per pass (mean)", "failed requests"):
        assert row in result.output
    summary = json.loads((out / "summary.json").read_text())["runs"][0]
    assert summary["requests"] == 16 and summary["failed"] == 0
    assert summary["token_throughput_tps"] == pytest.approx(summary["throughput_rps"] * 6)
    assert summary["ttft_p50"] > 0 and summary["e2e_p50"] >= summary["ttft_p50"]
    assert summary["goodput_rps"] == pytest.approx(summary["throughput_rps"])
    assert summary["mean_tokens_per_pass"] >= 1
    rows = pd.read_csv(out / "requests.csv")
    assert len(rows) == 16 and (rows.output_tokens == 6).all()
    assert rows["meets_sla@4"].mean() == pytest.approx(summary["sla_share@4"])  # the audit columns, as simulate
    if "--max-concurrency" in args:
        assert "poisson, at most 2 in flight" in result.output


def test_bench_bad_flags_and_unreachable_server(url):
    r = CliRunner().invoke(bench, ["--base-url", url, "--request-rate", "0"])
    assert r.exit_code != 0 and "--request-rate" in r.output
    r = CliRunner().invoke(bench, ["--base-url", "http://127.0.0.1:9", "--rate", "1"])
    assert r.exit_code != 0 and "cannot reach" in r.output


def test_seeded_workload_is_reproducible():
    from sim.bench import make_prompts

    a = make_prompts(np.random.default_rng([3, 0xB0]), np.array([5, 7]), 320)
    b = make_prompts(np.random.default_rng([3, 0xB0]), np.array([5, 7]), 320)
    assert a == b and [len(p) for p in a] == [5, 7] and all(3 <= t < 320 for p in a for t in p)


def test_each_client_warms_up_before_its_first_request():
    # a fresh client's first request would otherwise pay its HTTP stack's start-up, counted as admission
    import asyncio

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from sim.bench import run_workload
    from sim.workload import RequestTable

    seen = []
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        seen.append("models")
        return {"object": "list", "data": []}

    @app.post("/v1/completions")
    def completions():
        seen.append("completion")
        events = ['data: {"id": "c", "choices": [{"text": "x"}]}\n\n', "data: [DONE]\n\n"]
        return StreamingResponse(iter(events), media_type="text/event-stream")

    table = RequestTable(np.array([0.0, 0.01]), np.array([4, 4]), np.array([1, 1]))
    with serve_in_thread(app) as url:
        records = asyncio.run(run_workload(url, "m", table, [[1, 2, 3, 4]] * 2, clients=0, timeout=10))
    assert seen == ["models", "completion", "completion"]
    assert [r.output_tokens for r in records] == [1, 1] and all(r.error is None for r in records)


def test_a_request_on_a_connection_the_server_closes_is_sent_again():
    """A kept-alive connection the server closes as a request goes out (its keep-alive clock ran out while the client
    was still reading the last stream) gets no answer: the request is sent once more, on a fresh connection, and
    its times keep its first start. A connection that drops after the answer began fails the request, as before."""
    import asyncio

    import httpx

    from sim.bench import send

    answer = b'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s'
    event = b'data: {"id": "c", "choices": [{"text": "x"}]}\n\ndata: [DONE]\n\n'

    async def serve(then_cut: bool):
        connections = []

        async def handle(reader, writer):
            connections.append(writer)
            served = 0
            while await reader.readuntil(b"\r\n\r\n"):  # the request head (the body is small: in one read)
                await reader.read(65536)
                if served:  # a second request on this connection: the keep-alive clock ran out, close unanswered
                    writer.close()
                    return
                if then_cut:  # the answer begins, then the connection drops
                    writer.write(answer[:answer.index(b"%d")] + b"999\r\n\r\n" + event[:20])
                    await writer.drain()
                    writer.close()
                    return
                writer.write(answer % (len(event), event))
                await writer.drain()
                served += 1

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections

    async def main(then_cut: bool):
        server, url, connections = await serve(then_cut)
        async with server, httpx.AsyncClient(limits=httpx.Limits(keepalive_expiry=60)) as client:
            records = [Record(i, 4, 1) for i in range(2)]
            for record in records:
                await send(client, url, "m", [1, 2, 3, 4], record, 0.0)
        return records, len(connections)

    (first, second), opened = asyncio.run(main(then_cut=False))
    assert first.error is None and second.error is None and second.output_tokens == 1 and opened == 2
    assert second.chunk_times[0] > second.arrival
    (cut, _), _ = asyncio.run(main(then_cut=True))
    assert cut.error is not None and "RemoteProtocolError" in cut.error


def slow_even_rows_app(bodies: list | None = None):
    """A server whose completions of even rows (a prompt's first token id is its row) take 0.4 s, of odd ones 0.01 s:
    client process 0 of 2 gets the slow rows (rows p, p + 2, ...). ``bodies``: where to keep each request's body."""
    import asyncio

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": []}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if bodies is not None:
            bodies.append(body)
        row = body["prompt"][0]
        await asyncio.sleep(0.4 if row % 2 == 0 else 0.01)
        events = [f'data: {{"id": "c{row}", "choices": [{{"text": "x"}}]}}\n\n', "data: [DONE]\n\n"]
        return StreamingResponse(iter(events), media_type="text/event-stream")

    return app


def test_closed_loop_clients_share_one_queue_across_processes():
    # process p used to send rows p, p + processes, ...: the one whose rows ran longer finished last, alone, and
    # lowered the throughput measured; the simulator's clients take rows from one queue
    from sim.bench import run_spread
    from sim.workload import RequestTable

    rows = 8
    table = RequestTable(None, np.full(rows, 4), np.ones(rows, dtype=np.int64))
    with serve_in_thread(slow_even_rows_app()) as url:
        records = run_spread(url, "m", table, [[i] for i in range(rows)], clients=2, timeout=10, processes=2)
    assert [r.id for r in records] == list(range(rows)) and all(r.error is None for r in records)
    assert [r.response_id for r in records] == [f"c{i}" for i in range(rows)]  # each row sent once
    # shared: the 1.64 s of work splits over both clients (under 1 s); split by parity, the slow client takes 1.6 s
    assert max(r.chunk_times[-1] for r in records) < 1.2
    assert min(r.arrival for r in records) >= 0  # every process's clients start at the shared origin


def test_max_concurrency_is_one_cap_over_every_client_process():
    # split into a cap of 1 a process, the process of the slow (even) rows would send them one by one (1.6 s)
    # while the other's slot stayed idle; one shared cap sends every row in arrival order as a slot frees
    from sim.bench import run_spread
    from sim.workload import RequestTable

    rows = 8
    table = RequestTable(np.arange(rows) * 1e-3, np.full(rows, 4), np.ones(rows, dtype=np.int64))
    with serve_in_thread(slow_even_rows_app()) as url:
        records = run_spread(url, "m", table, [[i] for i in range(rows)], clients=0, timeout=10, processes=2,
                             max_concurrency=2)
    assert all(r.error is None for r in records) and [r.response_id for r in records] == [f"c{i}" for i in range(rows)]
    sent = [r.arrival for r in records]
    # in arrival order across both processes: a row waiting at the cap is never overtaken (each process stamps a send
    # as it starts it, so rows the cap let go together may differ by a fraction of a millisecond)
    assert all(later >= earlier - 5e-3 for earlier, later in zip(sent, sent[1:]))
    events = sorted([(r.arrival, 1) for r in records] + [(r.chunk_times[-1], -1) for r in records])
    assert max(np.cumsum([step for _, step in events])) == 2
    assert max(r.chunk_times[-1] for r in records) < 1.2  # about 0.82 s with one cap


def test_extra_body_reaches_every_request_from_every_client_process():
    # --temperature travels as a field of each request's body, from each client process
    from sim.bench import run_spread
    from sim.workload import RequestTable

    bodies = []
    rows = 4
    table = RequestTable(np.arange(rows) * 1e-3, np.full(rows, 4), np.ones(rows, dtype=np.int64))
    with serve_in_thread(slow_even_rows_app(bodies)) as url:
        records = run_spread(url, "m", table, [[i] for i in range(rows)], clients=0, timeout=10, processes=2,
                             extra_body={"temperature": 0.0})
        default = run_spread(url, "m", table, [[i] for i in range(rows)], clients=0, timeout=10)
    assert all(r.error is None for r in records + default)
    assert sorted(b["prompt"][0] for b in bodies[:rows]) == list(range(rows))
    assert [b.get("temperature") for b in bodies] == [0.0] * rows + [None] * rows  # else the server's default
