"""Text in and out: chat templates, string prompts, incremental detokenization and stop strings.

Uses the tiny model's own tokenizer when it ships one, else ``byte_tokenizer``."""

from __future__ import annotations

import httpx
import pytest
from serving import byte_tokenizer, serve_in_thread, wait_idle

from engine.detokenize import Detokenizer
from engine.server.app import create_app
from engine.server.engine_core import EngineSpec

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def test_incremental_detokenization_never_splits_a_character(tokenizer):
    text = "héllo wörld, ça va? 日本語 ok"
    ids = tokenizer(text)["input_ids"]
    detok = Detokenizer(tokenizer)
    deltas = [detok.add([t], final=(i == len(ids) - 1)) for i, t in enumerate(ids)]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if d == "") >= 4  # the second and third bytes of multi-byte characters


def test_stop_strings_are_cut_and_held_back(tokenizer):
    ids = tokenizer("abc STOP def")["input_ids"]
    detok = Detokenizer(tokenizer, stop=["STOP", "zz"])
    out = ""
    for t in ids:
        out += detok.add([t])
        assert "S" not in out  # never leaks the start of a stop string
        if detok.stopped:
            break
    assert detok.stopped and out == "abc "


@pytest.fixture(scope="module")
def url():
    app = create_app(EngineSpec(MODEL, dict(device="cpu", num_kv_blocks=256, seed=0)), MODEL)
    server = app.state.server
    if server.tokenizer is None:
        server.tokenizer = byte_tokenizer()
    with serve_in_thread(app) as url:
        yield url, server


def test_string_prompt_and_chat_round_trip(url):
    url, server = url
    tok = server.tokenizer
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "Hello there", "max_tokens": 7,
                                                  "temperature": 0, "ignore_eos": True}).json()
    assert r["usage"]["prompt_tokens"] == len(tok("Hello there")["input_ids"])
    choice = r["choices"][0]
    assert choice["text"] == tok.decode(choice["token_ids"], skip_special_tokens=True)

    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 5,
                                                       "temperature": 0, "ignore_eos": True}).json()
    expected_prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                              tokenize=True)
    if hasattr(expected_prompt, "keys"):
        expected_prompt = expected_prompt["input_ids"]
    assert r["usage"]["prompt_tokens"] == len(expected_prompt)
    assert r["choices"][0]["message"]["content"] == tok.decode(r["choices"][0]["token_ids"],
                                                               skip_special_tokens=True)


def test_stop_string_over_http_aborts_the_request(url):
    url, server = url
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    full = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    text = full["text"]
    stop = next((text[i:i + 2] for i in range(5, len(text) - 2) if text[i:i + 2].isprintable()
                 and text[i:i + 2].strip() and text[i:i + 2] not in text[:i]), None)
    if stop is None:
        pytest.fail(f"no usable stop string in {text!r}")
    r = httpx.post(url + "/v1/completions", json={**body, "stop": stop}).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["text"] == text[:text.index(stop)]
    assert len(r["token_ids"]) < 200
    wait_idle(server, timeout=2.0)  # the stop string aborted the request: nothing left running
