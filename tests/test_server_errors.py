"""Bad input answers 400 with an OpenAI-style body naming the field, a full waiting queue answers 429, and
neither disturbs requests already in flight; every other error (404, 405, 413, 415, 431, 500) is an OpenAI error
object too, and none echoes an exception's internals."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from serving import serve_in_thread, wait_idle

from engine.server.app import create_app
from engine.server.config import ServerConfig
from engine.server.engine_core import EngineSpec
from engine.server.guards import install_guards

MODEL = "tiny-llama"
OK = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4}

BAD = [  # (raw body, field the error must name)
    (b'{"model": "tiny-llama", "prompt": [1, 2,', "body"),
    (b'{"model": "tiny-llama", "prompt": "caf\xe9"}', "prompt"),
    (b'\xff\xfe{}', "body"),
    (b'[1, 2]', "body"),
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
    (json.dumps({**OK, "temperature": 1e9}).encode(), "temperature"),
    (json.dumps({**OK, "max_tokens": 10**12}).encode(), "max_tokens"),  # prompt + max_tokens > context 1024
    (json.dumps({**OK, "max_tokens": 1022}).encode(), "max_tokens"),
    (json.dumps({**OK, "stop": ["x"] * 10_000}).encode(), "stop"),
    (json.dumps({**OK, "stop": "x" * 5000}).encode(), "stop"),
    (json.dumps({**OK, "stop_token_ids": [1] * 10_000}).encode(), "stop_token_ids"),
    (json.dumps({**OK, "stop_token_ids": [10**9]}).encode(), "stop_token_ids"),
    (json.dumps({**OK, "seed": 10**30}).encode(), "seed"),
    (b"[" * 100_000, "body"),
]


@pytest.fixture(scope="module")
def served():
    config = ServerConfig(max_request_body_bytes=1 << 20)
    app = create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=256, seed=0)), MODEL, config=config,
                     aliases=("engine/assets/tiny-llama",))
    with serve_in_thread(app, config=config) as url:
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
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                  "max_completion_tokens": 5000}, "max_completion_tokens"),
    ]:
        check_error(httpx.post(url + path, json=body), 400, param)
    thread.join(timeout=120)
    assert len(result["tokens"]) == 300, "the request in flight was disturbed"
    # and the server still serves
    assert httpx.post(url + "/v1/completions", json=OK).json()["choices"][0]["finish_reason"] == "length"


def test_unknown_model_404_and_every_error_is_an_openai_error_object(served):
    url, _ = served
    for path, body in [("/v1/completions", {**OK, "model": "gpt-9"}),
                       ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]})]:
        assert check_error(httpx.post(url + path, json=body), 404, "model")["type"] == "not_found_error"
    # the model's path is an alias; responses show the served name
    r = httpx.post(url + "/v1/completions", json={**OK, "model": "engine/assets/tiny-llama"})
    assert r.status_code == 200 and r.json()["model"] == MODEL
    assert check_error(httpx.get(url + "/v1/nothing"), 404, None)["code"] == 404
    assert check_error(httpx.get(url + "/v1/completions"), 405, None)["code"] == 405
    plain = httpx.post(url + "/v1/completions", content=json.dumps(OK), headers={"content-type": "text/plain"})
    check_error(plain, 415, "content-type")
    big = httpx.post(url + "/v1/completions", content=b"x" * (2 << 20), headers={"content-type": "application/json"})
    check_error(big, 413, "body")

    def chunked():
        yield b'{"model": "tiny-llama", "prompt": "'
        for _ in range(40):
            yield b"a" * 65536

    check_error(httpx.post(url + "/v1/completions", content=chunked(), headers={"content-type": "application/json"}),
                413, "body")
    check_error(httpx.post(url + "/v1/completions", json=OK, headers={"x-big": "a" * 65536}), 431, "headers")
    many = {f"x-h{i}": "1" for i in range(300)}
    check_error(httpx.post(url + "/v1/completions", json=OK, headers=many), 431, "headers")
    nested = httpx.post(url + "/v1/completions", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert "Recursion" not in nested.text and "Traceback" not in nested.text
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and not any("pid" in key for key in health)
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == MODEL


def test_internal_errors_hide_the_exception():
    from fastapi import FastAPI

    app = FastAPI()
    install_guards(app, ServerConfig())

    @app.get("/boom")
    async def boom():
        raise RuntimeError("secret /internal/path")

    with serve_in_thread(app) as url:
        r = httpx.get(url + "/boom")
    error = check_error(r, 500, None)
    assert error["type"] == "server_error" and "secret" not in r.text


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
