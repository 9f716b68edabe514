"""Bad input answers 400 with an OpenAI-style body naming the field, a full waiting queue answers 429, and
neither disturbs requests already in flight."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from serving import serve_in_thread, wait_idle

from engine.server.app import create_app
from engine.server.engine_core import EngineSpec

MODEL = "tiny-llama"
OK = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4}

BAD = [  # (raw body, field the error must name)
    (b'{"model": "tiny-llama", "prompt": [1, 2,', "body"),
    (b'{"model": "tiny-llama", "prompt": "caf\xe9"}', "prompt"),
    (b'\xff\xfe{}', "body"),
    (b'[1, 2]', "body"),
    (json.dumps({**OK, "model": "gpt-9"}).encode(), "model"),
    (json.dumps({"model": MODEL}).encode(), "prompt"),
    (json.dumps({**OK, "prompt": []}).encode(), "prompt"),
    (json.dumps({**OK, "prompt": [1, 99999]}).encode(), "prompt"),
    (json.dumps({**OK, "prompt": list(range(3, 300)) * 4}).encode(), "prompt"),  # 1188 tokens > context 1024
    (json.dumps({**OK, "temperature": -0.5}).encode(), "temperature"),
    (json.dumps({**OK, "top_p": 0}).encode(), "top_p"),
    (json.dumps({**OK, "top_p": 1.5}).encode(), "top_p"),
    (json.dumps({**OK, "top_k": 0}).encode(), "top_k"),
    (json.dumps({**OK, "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({**OK, "max_tokens": "many"}).encode(), "max_tokens"),
    (json.dumps({**OK, "min_tokens": 9}).encode(), "min_tokens"),
    (json.dumps({**OK, "n": 3}).encode(), "n"),
    (b'{"model": "tiny-llama", "prompt": [1], "temperature": NaN}', "temperature"),
]


@pytest.fixture(scope="module")
def served():
    app = create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=256, seed=0)), MODEL)
    with serve_in_thread(app) as url:
        yield url, app.state.server


def check_error(r: httpx.Response, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    return error


def test_bad_input_is_400_naming_the_field_and_leaves_others_alone(served):
    url, _ = served
    long_body = {"model": MODEL, "prompt": [9] * 30, "max_tokens": 300, "ignore_eos": True, "stream": True}
    result = {}

    def long_request():
        tokens = []
        with httpx.stream("POST", url + "/v1/completions", json=long_body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    tokens += json.loads(line[6:])["choices"][0]["token_ids"]
        result["tokens"] = tokens

    thread = threading.Thread(target=long_request)
    thread.start()
    for raw, param in BAD:
        r = httpx.post(url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
        error = check_error(r, 400, param)
        assert error["type"] == "invalid_request_error"
    for path, body, param in [
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]},
         "messages[0].role"),
        ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ]:
        check_error(httpx.post(url + path, json=body), 400, param)
    thread.join(timeout=120)
    assert len(result["tokens"]) == 300, "the request in flight was disturbed"
    # and the server still serves
    assert httpx.post(url + "/v1/completions", json=OK).json()["choices"][0]["finish_reason"] == "length"


def test_prompt_too_long_for_the_cache_and_queue_full():
    # 8 blocks of 16 tokens: a request needing more can never run; one sequence at a time, two may wait
    spec = EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=8, max_num_seqs=1, seed=0))
    app = create_app(spec, MODEL, max_waiting=2)
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/v1/completions", json={**OK, "prompt": [4] * 100, "max_tokens": 100})
        assert "KV blocks" in check_error(r, 400, "prompt")["message"]

        statuses = []

        def one():
            body = {**OK, "max_tokens": 60, "ignore_eos": True}
            statuses.append(httpx.post(url + "/v1/completions", json=body, timeout=120))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r.status_code for r in statuses)
        assert 200 in codes and 429 in codes and set(codes) <= {200, 429}, codes
        for r in statuses:
            if r.status_code == 429:
                assert r.json()["error"]["type"] == "rate_limit_error"
            else:
                assert len(r.json()["choices"][0]["token_ids"]) == 60
        wait_idle(app.state.server, timeout=3.0)
        assert app.state.server.loop.stats()["kv_free_blocks"] == 8
