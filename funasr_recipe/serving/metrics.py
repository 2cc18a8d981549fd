"""Prometheus metrics of the HTTP service, in a registry of its own (GET /metrics serves it).

Reads and writes nothing; the app and the batcher update them:
  recipe_serve_requests_total{endpoint,code}   requests answered, by HTTP status
  recipe_serve_errors_total{reason}            refused or failed requests, by reason
  recipe_serve_latency_seconds{endpoint}       request latency (upload read to answer)
  recipe_serve_batch_size                      pieces per decoded batch
  recipe_serve_batch_seconds                   time of one batch's decode
  recipe_serve_queue_depth                     pieces waiting (sampled at each scrape)
  recipe_serve_audio_seconds_total             audio transcribed
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class ServeMetrics:
    def __init__(self, queue_depth: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("recipe_serve_requests", "Requests answered", ["endpoint", "code"],
                                registry=r)
        self.errors = Counter("recipe_serve_errors", "Refused or failed requests", ["reason"], registry=r)
        self.latency = Histogram("recipe_serve_latency_seconds", "Request latency", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("recipe_serve_batch_size", "Pieces per decoded batch",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("recipe_serve_batch_seconds", "Decode time of one batch",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("recipe_serve_queue_depth", "Pieces waiting to be decoded", registry=r)
        self.queue_depth.set_function(queue_depth)
        self.audio_seconds = Counter("recipe_serve_audio_seconds", "Audio transcribed (s)", registry=r)

    def on_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
