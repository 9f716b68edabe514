"""Prometheus metrics through ``prometheus_client``, named as vLLM names them (``vllm:...`` with a ``model_name``
label, ``vllm:request_success_total{finished_reason=...}``), plus ``splitfuse_...`` for what vLLM has no name for
(tokens per pass, KV blocks, engine busy time, 429s). The router re-exposes its replicas' metrics with a
``replica`` label (``ReplicaMetrics``): sum over it in PromQL for the fleet, as one would over vLLM pods."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
                   10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 2048, 4096, 8192)
FINISH_REASONS = ("stop", "length", "abort", "error")

CONTENT_TYPE = CONTENT_TYPE_LATEST


class EngineStats:
    """A collector of what the engine reported last (read at scrape time): vLLM's scheduler gauges and
    ``splitfuse_`` extras. ``splitfuse_preemptions_total`` stays next to ``vllm:num_preemptions_total`` for
    readers of the old name (``splitfuse bench``)."""

    def __init__(self, stats, model_name: str) -> None:
        self.stats, self.model_name = stats, model_name

    def collect(self):
        s, label = self.stats(), {"model_name": self.model_name}
        for name, help, key in (("vllm:num_requests_running", "Requests in the running batch.", "running"),
                                ("vllm:num_requests_waiting", "Requests waiting (incl. preempted).", "waiting"),
                                ("vllm:kv_cache_usage_perc", "KV-cache usage (1 = 100%).", "kv_usage"),
                                ("vllm:gpu_cache_usage_perc", "KV-cache usage (1 = 100%); vLLM's older name.",
                                 "kv_usage")):
            g = GaugeMetricFamily(name, help, labels=list(label))
            g.add_metric(list(label.values()), float(s.get(key, 0)))
            yield g
        c = CounterMetricFamily("vllm:num_preemptions", "Preemptions by recompute since start.", labels=list(label))
        c.add_metric(list(label.values()), float(s.get("preemptions", 0)))
        yield c
        yield GaugeMetricFamily("splitfuse_kv_free_blocks", "Free KV blocks.", value=s.get("kv_free_blocks", 0))
        yield GaugeMetricFamily("splitfuse_kv_total_blocks", "KV blocks in the cache.",
                                value=s.get("kv_total_blocks", 0))
        yield CounterMetricFamily("splitfuse_preemptions", "Preemptions by recompute since start.",
                                  value=s.get("preemptions", 0))
        yield CounterMetricFamily("splitfuse_engine_busy_seconds", "Seconds the engine spent in steps.",
                                  value=s.get("busy_s", 0.0))


class ServingMetrics:
    """What one server exposes on /metrics, in a registry of its own; the client observes, the engine's gauges
    are read at scrape time from ``stats()`` (running, waiting, kv_usage, KV blocks, preemptions, busy_s)."""

    def __init__(self, stats, model_name: str = "") -> None:
        r = self.registry = CollectorRegistry()
        label = {"model_name": model_name}

        def histogram(name, help, buckets=LATENCY_BUCKETS):
            return Histogram(name, help, list(label), buckets=buckets, registry=r).labels(**label)

        def counter(name, help):
            return Counter(name, help, list(label), registry=r).labels(**label)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first generated token.")
        self.itl = histogram("vllm:time_per_output_token_seconds", "Gap between consecutive tokens of a request.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.")
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled pass.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        success = Counter("vllm:request_success", "Finished requests by finish reason.",
                          ["model_name", "finished_reason"], registry=r)
        self.requests = {reason: success.labels(model_name=model_name, finished_reason=reason)
                         for reason in FINISH_REASONS}
        self.tokens_per_pass = Histogram("splitfuse_tokens_per_pass", "Tokens carried by one forward pass.",
                                         buckets=TOKEN_BUCKETS, registry=r)
        self.rejected = Counter("splitfuse_requests_rejected", "Requests answered 429 (waiting queue full).",
                                registry=r)
        r.register(EngineStats(stats, model_name))

    def render(self) -> str:
        return generate_latest(self.registry).decode()


class ReplicaMetrics:
    """A collector of the replicas' last scraped /metrics, each sample labelled with its ``replica`` index."""

    def __init__(self) -> None:
        self.texts: dict[int, str] = {}

    def collect(self):
        families: dict[tuple[str, str], Metric] = {}
        for index, text in sorted(self.texts.items()):
            for family in text_string_to_metric_families(text):
                merged = families.setdefault((family.name, family.type),
                                             Metric(family.name, family.documentation, family.type))
                for s in family.samples:
                    merged.add_sample(s.name, {**s.labels, "replica": str(index)}, s.value)
        yield from families.values()
