"""The Grafana dashboard queries only series the proxy's /metrics really exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.backends.load import LoadSnapshot
from proxy.backends.pool import BackendPool
from proxy.config import HealthConfig, ScrapeConfig
from proxy.routing.index import PrefixIndex
from proxy.telemetry.metrics import ProxyMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "prefix-proxy.json"
BACKEND = "http://127.0.0.1:8001"
# Labels Prometheus adds at scrape time; they are not in the exposition itself.
TARGET_LABELS = {"instance", "job"}
METRIC = re.compile(r"\bprefix_proxy_[A-Za-z0-9_]+\b")
SELECTOR = re.compile(r"\b(prefix_proxy_[A-Za-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exposed() -> dict[str, set[str]]:
    """Every sample name on /metrics with its label names, each labelled metric used once."""
    metrics = ProxyMetrics()
    pool = BackendPool(HealthConfig(), ScrapeConfig())
    backend = pool.add(BACKEND, 0.0)
    backend.load = LoadSnapshot(
        "vllm", 0.0, running=1, waiting=2, kv_usage=0.5, kv_capacity_tokens=4096
    )
    backend.last_scrape_ok = True
    backend.engine_hit_rate = 0.4
    backend.predicted_hit_tokens, backend.predicted_prompt_tokens = 50.0, 100.0
    index = PrefixIndex(1024)
    index.insert(BACKEND, [1, 2, 3])
    metrics.watch(pool, index, lambda: 1.0)
    for metric in vars(metrics).values():
        if isinstance(metric, Counter | Gauge | Histogram):
            child = metric.labels(*metric._labelnames) if metric._labelnames else metric
            if isinstance(child, Histogram):
                child.observe(0.5)
            else:
                child.inc()
    text = generate_latest(metrics.registry).decode()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL text in the dashboard: panel targets and template variables."""
    found: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            found.extend(t["expr"] for t in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            found.append(var["query"]["query"])
    return found


def test_the_exposition_has_the_per_backend_series(exposed):
    for name in (
        "prefix_proxy_requests_total",
        "prefix_proxy_ttft_seconds_bucket",
        "prefix_proxy_backend_running_requests",
        "prefix_proxy_backend_engine_prefix_hit_ratio",
        "prefix_proxy_backend_predicted_prefix_hit_ratio",
    ):
        assert name in exposed
    assert exposed["prefix_proxy_backend_running_requests"] == {"backend"}
    assert "le" in exposed["prefix_proxy_ttft_seconds_bucket"]


def test_every_queried_metric_is_exposed(dashboard, exposed):
    queried = {name for q in queries(dashboard) for name in METRIC.findall(q)}
    assert len(queried) >= 25, "the dashboard covers the proxy's metrics"
    missing = sorted(queried - exposed.keys())
    assert missing == [], f"the dashboard queries series /metrics does not have: {missing}"


def test_every_label_a_query_uses_exists(dashboard, exposed):
    problems = []
    for q in queries(dashboard):
        names = set(METRIC.findall(q))
        available = TARGET_LABELS.union(*(exposed.get(n, set()) for n in names))
        for name, matchers in SELECTOR.findall(q):
            for label in MATCHER.findall(matchers):
                if label not in exposed.get(name, set()) | TARGET_LABELS:
                    problems.append(f"{name} has no label {label!r}: {q}")
        for group in GROUPING.findall(q):
            for label in filter(None, (g.strip() for g in group.split(","))):
                if label not in available:
                    problems.append(f"grouping by {label!r} that no queried metric has: {q}")
    assert problems == []


def test_the_dashboard_model_is_importable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert '{instance=~"$instance"' in target["expr"], target["expr"]
            assert target["expr"].count("(") == target["expr"].count(")")


def test_the_panels_do_not_overlap(dashboard):
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells
