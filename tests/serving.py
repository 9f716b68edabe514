"""Test helpers for the server: run an ASGI app in a background thread (``with serve_in_thread(app) as url``)
and a byte-level tokenizer for models that ship none."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

from engine.server.config import ServerConfig
from engine.server.router import free_port


@contextlib.contextmanager
def serve_in_thread(app, host: str = "127.0.0.1", port: int | None = None, timeout: float = 30.0,
                    config: ServerConfig | None = None):
    """``app`` served as ``splitfuse serve`` serves it (its connection limits from ``config``; a short shutdown
    timeout by default)."""
    from engine.server.http import make_server

    port = port or free_port(host)
    service = getattr(app.state, "server", None)
    server = make_server(app, host, port, "warning", config or ServerConfig(shutdown_timeout=1.0), service)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server on {host}:{port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_idle(server, timeout: float = 10.0) -> float:
    """Seconds until ``server`` (an ``app.state.server``) reports no request in its engine and every KV block
    free (fails after ``timeout``). With the engine in its own process these are its last reported stats."""
    start = time.monotonic()
    while True:
        stats = server.loop.stats()
        if not stats.get("unfinished", True) and stats.get("waiting") == 0 and stats.get("running") == 0 \
                and stats.get("kv_free_blocks") == stats.get("kv_total_blocks"):
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"the engine is not idle after {timeout} s: {stats}"
        time.sleep(0.01)


def byte_tokenizer():
    """Byte-level: ids 0-2 are <unk>, <s>, </s> (as in the tiny model's config), the 256 bytes follow; a toy
    chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({ch: 3 + i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    t.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
    return t


def metric(url: str, name: str, **labels) -> float:
    """The sum of the samples of ``name`` on ``url``'s /metrics whose labels include ``labels``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == name and labels.items() <= s.labels.items()]
    if not values:
        raise KeyError(name)
    return sum(values)


def start_cli(*flags: str, model: str = "tiny-llama", env: dict | None = None,
              timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """``splitfuse serve MODEL --device cpu --threads 1 FLAGS`` in a process of its own on a free port; returns
    (process, url) once its /health answers 200."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "engine.server.cli", model, "--port", str(port), "--device", "cpu",
           "--threads", "1", *flags]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, "the server exited while starting"
        assert time.monotonic() < deadline, "the server did not start"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
