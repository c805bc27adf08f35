"""The proxy's own Prometheus metrics, in a registry of its own (no global state).

Counters and histograms are updated on the request path; everything per backend (health,
scraped load, hit rates, index size) is read from live state at scrape time by a collector,
so a backend that leaves also leaves /metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.backends.pool import BackendPool
from proxy.routing.index import PrefixIndex

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)

# `*_created` series double the exposition for no routing value.
disable_created_metrics()


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "prefix_proxy_requests",
            "Requests answered, by endpoint, model, backend and HTTP status.",
            ["endpoint", "model", "backend", "status"],
            registry=r,
        )
        self.rejected = Counter(
            "prefix_proxy_rejected_requests",
            "Requests the proxy answered itself with an error, by reason.",
            ["reason"],
            registry=r,
        )
        self.decisions = Counter(
            "prefix_proxy_routing_decisions",
            "Routing decisions by the scorer (or rule) that decided them.",
            ["policy", "reason"],
            registry=r,
        )
        self.match_ratio = Histogram(
            "prefix_proxy_predicted_prefix_match_ratio",
            "Share of the prompt the chosen backend was predicted to hold.",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "prefix_proxy_ttft_seconds",
            "Time to first response byte from the backend, measured at the proxy.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "prefix_proxy_request_duration_seconds",
            "End-to-end request duration measured at the proxy.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.routing_seconds = Histogram(
            "prefix_proxy_routing_seconds",
            "Time to parse, render, hash and route one request.",
            buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
            registry=r,
        )
        self.retries = Counter(
            "prefix_proxy_upstream_retries",
            "Attempts retried on another backend before the first byte, by cause.",
            ["kind"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "prefix_proxy_upstream_errors",
            "Upstream failures by kind (connect, timeout, status_5xx, midstream).",
            ["backend", "kind"],
            registry=r,
        )
        self.client_aborts = Counter(
            "prefix_proxy_client_aborts",
            "Requests whose client left before the answer was complete.",
            registry=r,
        )
        self.ejections = Counter(
            "prefix_proxy_backend_ejections",
            "Passive outlier ejections.",
            ["backend"],
            registry=r,
        )
        self.scrapes = Counter(
            "prefix_proxy_backend_scrapes",
            "Metrics scrapes by outcome (ok, unreachable, unparseable).",
            ["backend", "outcome"],
            registry=r,
        )
        self.scrape_problems = Counter(
            "prefix_proxy_backend_scrape_problems",
            "Problems found in scraped metrics pages, by code.",
            ["backend", "problem"],
            registry=r,
        )
        self.config_reloads = Counter(
            "prefix_proxy_config_reloads",
            "Config reload attempts by outcome.",
            ["outcome"],
            registry=r,
        )
        self.cluster_up = Gauge(
            "prefix_proxy_cluster_sync_up",
            "1 when cluster sync through Redis is connected, else 0.",
            registry=r,
        )
        self.cluster_lag = Gauge(
            "prefix_proxy_cluster_sync_lag_seconds",
            "Age of the newest peer update applied to the local index.",
            registry=r,
        )
        self.cluster_events = Counter(
            "prefix_proxy_cluster_sync_events",
            "Cluster sync events: sent, received, dropped (buffer full), invalid, rejected.",
            ["direction"],
            registry=r,
        )

    def watch(self, pool: BackendPool, index: PrefixIndex, clock: Callable[[], float]) -> None:
        self.registry.register(PoolCollector(pool, index, clock))


class PoolCollector(Collector):
    """Per-backend gauges read from live pool state at scrape time."""

    def __init__(self, pool: BackendPool, index: PrefixIndex, clock: Callable[[], float]):
        self.pool = pool
        self.index = index
        self.clock = clock

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self.clock()

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"prefix_proxy_backend_{name}", doc, labels=["backend"])

        healthy = gauge("healthy", "1 when the backend passes health checks and is not ejected.")
        draining = gauge("draining", "1 while the backend is draining.")
        inflight = gauge("inflight_requests", "Requests this proxy has outstanding on it.")
        running = gauge("running_requests", "Running requests, last scrape.")
        waiting = gauge("waiting_requests", "Waiting requests, last scrape.")
        kv = gauge("kv_usage_ratio", "KV cache usage 0..1, last scrape.")
        age = gauge("scrape_age_seconds", "Age of the last successful scrape.")
        stale = gauge("load_stale", "1 when routing ignores scraped load (stale or failing).")
        engine_hit = gauge("engine_prefix_hit_ratio", "The engine's own prefix-cache hit ratio.")
        predicted = gauge("predicted_prefix_hit_ratio", "Share of prompt tokens predicted cached.")
        blocks = gauge("index_blocks", "Blocks the prefix index attributes to the backend.")
        capacity = gauge("index_capacity_blocks", "Index capacity (follows the engine's KV).")
        stale_after = self.pool.scrape.stale_after_s
        for b in self.pool:
            lbl = [b.url]
            healthy.add_metric(lbl, float(b.healthy and not b.circuit_open))
            draining.add_metric(lbl, float(b.draining))
            inflight.add_metric(lbl, float(b.inflight))
            if b.load is not None:
                if b.load.running is not None:
                    running.add_metric(lbl, b.load.running)
                if b.load.waiting is not None:
                    waiting.add_metric(lbl, b.load.waiting)
                if b.load.kv_usage is not None:
                    kv.add_metric(lbl, b.load.kv_usage)
                age.add_metric(lbl, max(0.0, now - b.load.scraped_at))
            stale.add_metric(lbl, float(b.load_stale(now, stale_after)))
            if b.engine_hit_rate is not None:
                engine_hit.add_metric(lbl, b.engine_hit_rate)
            rate = b.predicted_hit_rate()
            if rate is not None:
                predicted.add_metric(lbl, rate)
            blocks.add_metric(lbl, float(self.index.size(b.url)))
            capacity.add_metric(lbl, float(self.index.capacity(b.url)))
        yield from (healthy, draining, inflight, running, waiting, kv, age, stale)
        yield from (engine_hit, predicted, blocks, capacity)
