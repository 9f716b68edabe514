"""Prometheus text exposition (format 0.0.4) for a handful of metrics, without a client library."""

from __future__ import annotations

import bisect
import math

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
                   10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 2048, 4096, 8192)


def _num(x: float) -> str:
    x = float(x)
    if x == math.inf:
        return "+Inf"
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


class Histogram:
    def __init__(self, name: str, help: str, buckets=LATENCY_BUCKETS) -> None:
        self.name, self.help = name, help
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # last one: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            cumulative += n
            lines.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {cumulative}')
        lines += [f"{self.name}_sum {self.sum!r}", f"{self.name}_count {self.count}"]
        return lines


class Counter:
    def __init__(self, name: str, help: str) -> None:
        self.name, self.help, self.value = name, help, 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter", f"{self.name} {_num(self.value)}"]


class Gauge:
    """A value read from ``read()`` at scrape time, or set with ``set``; ``kind`` "counter" for a total kept
    elsewhere."""

    def __init__(self, name: str, help: str, read=None, kind: str = "gauge") -> None:
        self.name, self.help, self.read, self.value, self.kind = name, help, read, 0.0, kind

    def set(self, value: float) -> None:
        self.value = value

    def render(self) -> list[str]:
        value = self.read() if self.read is not None else self.value
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}", f"{self.name} {_num(value)}"]


class Registry:
    def __init__(self) -> None:
        self.metrics: list = []

    def add(self, metric):
        self.metrics.append(metric)
        return metric

    def render(self) -> str:
        return "\n".join(line for m in self.metrics for line in m.render()) + "\n"


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServingMetrics:
    """What the server exposes on /metrics; the engine loop observes, gauges read the engine at scrape time."""

    def __init__(self, stats) -> None:
        """``stats()`` returns a dict with running, waiting, kv_usage, free/total blocks and preemptions."""
        r = self.registry = Registry()
        p = "splitfuse_"
        self.ttft = r.add(Histogram(p + "time_to_first_token_seconds", "Arrival to first generated token."))
        self.itl = r.add(Histogram(p + "inter_token_latency_seconds", "Gap between consecutive tokens of a request."))
        self.e2e = r.add(Histogram(p + "e2e_request_latency_seconds", "Arrival to last token."))
        self.queue = r.add(Histogram(p + "request_queue_time_seconds", "Arrival to first scheduled pass."))
        self.tokens_per_pass = r.add(Histogram(p + "tokens_per_pass", "Tokens carried by one forward pass.",
                                               TOKEN_BUCKETS))
        self.prompt_tokens = r.add(Counter(p + "prompt_tokens_total", "Prompt tokens of admitted requests."))
        self.generation_tokens = r.add(Counter(p + "generation_tokens_total", "Generated tokens."))
        self.requests = {reason: r.add(Counter(f"{p}requests_{reason}_total", f"Requests finished by {reason}."))
                         for reason in ("stop", "length", "abort", "error")}
        self.rejected = r.add(Counter(p + "requests_rejected_total", "Requests answered 429 (waiting queue full)."))
        for key, help in (("running", "Requests in the running batch."),
                          ("waiting", "Requests waiting for admission (incl. preempted)."),
                          ("kv_usage", "Share of KV blocks in use (0..1)."),
                          ("kv_free_blocks", "Free KV blocks."),
                          ("kv_total_blocks", "KV blocks in the cache.")):
            r.add(Gauge(p + key, help, read=lambda key=key: stats().get(key, 0)))
        r.add(Gauge(p + "preemptions_total", "Preemptions by recompute since start.",
                    read=lambda: stats().get("preemptions", 0), kind="counter"))
        r.add(Gauge(p + "engine_busy_seconds_total", "Seconds the engine spent in steps (forward passes).",
                    read=lambda: stats().get("busy_s", 0.0), kind="counter"))

    def render(self) -> str:
        return self.registry.render()
