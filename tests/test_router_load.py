"""The router's view of a replica's load, without processes: what least-kv reads between health reports."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from engine.server.router import DROPPED_S, HEALTH_FAILURES, Replica, Router, Sent


def test_a_prompt_counts_as_unstarted_until_its_first_token_is_back():
    replica = Replica(0, "http://r0")
    a, b = Sent(replica, 1000, 100), Sent(replica, 500, 50)
    assert (replica.outstanding_requests, replica.outstanding_tokens, replica.unstarted_tokens) == (2, 1650, 1500)
    a.start()
    a.start()  # once only
    assert replica.unstarted_tokens == 500
    a.release()
    b.release()  # failed or answered whole before streaming: its prompt leaves the count too
    assert (replica.outstanding_requests, replica.outstanding_tokens, replica.unstarted_tokens) == (0, 0, 0)


def test_a_health_report_keeps_the_prompts_a_replica_has_not_started():
    """A replica just sent a run of requests holds few of their KV blocks at the next report (their prompts wait):
    least-kv counts those prompts on top of the report, so it does not read that replica as the emptiest again."""

    async def scenario():
        usage = {"r0": 0.30, "r1": 0.10}

        def health(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"status": "ok", "kv_usage": usage[request.url.host],
                                             "kv_capacity_tokens": 10_000})

        router = Router([Replica(0, "http://r0"), Replica(1, "http://r1")], balancer="least-kv")
        router.client = httpx.AsyncClient(transport=httpx.MockTransport(health))
        r0, r1 = router.replicas
        waiting = [Sent(r1, 1500, 100) for _ in range(2)]
        await asyncio.gather(*(router.check(r) for r in router.replicas))
        assert r0.healthy and r1.healthy
        assert r1.load().kv_usage == pytest.approx(0.10 + 3000 / 10_000)
        assert router.pick(set()) is r0
        waiting[0].start()  # started since the report: the report stands until the next one
        assert r1.load().kv_usage == pytest.approx(0.40)
        Sent(r0, 1500, 100)
        assert r0.load().kv_usage == pytest.approx(0.30 + 1600 / 10_000)
        await router.client.aclose()

    asyncio.run(scenario())


def test_a_replica_leaves_rotation_after_failed_checks_in_a_row_and_comes_back_on_one():
    """One slow or failed health check (a busy API process) keeps a replica in rotation; ``HEALTH_FAILURES`` in a
    row take it out, and the next check it passes brings it back. A request it failed takes it out at once."""

    async def scenario():
        answers = []

        def health(request: httpx.Request) -> httpx.Response:
            if answers.pop(0):
                return httpx.Response(200, json={"status": "ok", "kv_usage": 0.0, "kv_capacity_tokens": 1000})
            raise httpx.ReadTimeout("slow", request=request)

        router = Router([Replica(0, "http://r0")])
        router.client = httpx.AsyncClient(transport=httpx.MockTransport(health))
        replica, = router.replicas
        seen = []
        for ok in (True, False, True) + (False,) * HEALTH_FAILURES + (True,):
            answers.append(ok)
            await router.check(replica)
            seen.append(replica.healthy)
        assert seen == [True, True, True] + [True] * (HEALTH_FAILURES - 1) + [False, True]
        router.suspect(replica)
        assert router.pick(set()) is None
        await router.client.aclose()

    asyncio.run(scenario())


def test_a_dropped_connection_is_tried_again_once_and_a_refused_one_takes_the_replica_out():
    """A kept-alive connection that closes unanswered (the server's keep-alive ran out as the request went out) is
    sent to the same replica again on another connection, which says nothing of the replica. On a loaded machine a
    replica whose process is up may drop a fresh connection too: with no other replica left the request is sent to it
    again and served, and the replica stays in rotation; a second drop within ``DROPPED_S`` takes it out and the
    request is answered 503, naming the replica. A refused connection takes it out at once."""
    from starlette.requests import Request

    body = b'{"prompt": [1, 2], "max_tokens": 2}'

    def request() -> Request:
        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        return Request({"type": "http", "method": "POST", "path": "/v1/completions",
                        "headers": [(b"content-type", b"application/json")]}, receive)

    async def scenario():
        failures = []

        def replica_answer(req: httpx.Request) -> httpx.Response:
            if failures:
                raise failures.pop(0)(f"dropped by {req.url.host}", request=req)
            return httpx.Response(200, json={"choices": [{"text": "ok"}]})

        router = Router([Replica(0, "http://r0", healthy=True)])
        router.client = httpx.AsyncClient(transport=httpx.MockTransport(replica_answer))
        replica, = router.replicas
        failures.append(httpx.RemoteProtocolError)  # a kept-alive connection closed unanswered
        served = await router.proxy(request(), "/v1/completions")
        assert served.status_code == 200 and replica.healthy and router.retries == 1
        assert replica.dropped_at == -math.inf  # not a drop
        failures += [httpx.ReadError, httpx.ReadError]  # and the connection it was sent again on dropped too
        served = await router.proxy(request(), "/v1/completions")
        assert served.status_code == 200 and replica.healthy and router.retries == 3 and replica.dropped_at > 0
        failures += [httpx.ReadError, httpx.ReadError]  # within DROPPED_S of that drop
        refused = await router.proxy(request(), "/v1/completions")
        assert refused.status_code == 503 and b"replica 0 unreachable" in refused.body and not replica.healthy
        assert not failures and router.retries == 5
        replica.healthy, replica.dropped_at = True, replica.dropped_at - DROPPED_S  # a check passed, a while later
        failures.append(httpx.ConnectError)
        assert (await router.proxy(request(), "/v1/completions")).status_code == 503 and not replica.healthy
        assert not failures and router.retries == 6
        await router.client.aclose()

    asyncio.run(scenario())
