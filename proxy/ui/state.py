"""The JSON behind the status page: the pool as the admin API sees it, plus recent rates.

Per-backend and fleet request rates are computed here, server-side, from counter deltas
against a reading up to ``RATE_WINDOW_S`` old, so every viewer (and the tests) sees the same
numbers. TTFT quantiles come from the TTFT histogram's bucket deltas over ``TTFT_WINDOW_S``:
a longer window, since a p99 needs more than a handful of requests.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics import MetricWrapperBase

from proxy.admin import backend_status
from proxy.ui.window import (
    Buckets,
    Sample,
    SampleHistory,
    bucket_delta,
    delta,
    histogram_quantile,
    rate,
)

if TYPE_CHECKING:
    from proxy.app import ProxyApp

RATE_WINDOW_S = 10.0
TTFT_WINDOW_S = 60.0


def read_sample(proxy: ProxyApp, now: float) -> Sample:
    metrics = proxy.metrics
    requests = sum(s.value for s in _samples(metrics.requests, "_total"))
    decisions: dict[str, float] = {}
    for s in _samples(metrics.decisions, "_total"):
        reason = s.labels.get("reason", "")
        decisions[reason] = decisions.get(reason, 0.0) + s.value
    ttft: dict[float, float] = {}
    for s in _samples(metrics.ttft, "_bucket"):
        le = float(s.labels["le"])
        ttft[le] = ttft.get(le, 0.0) + s.value
    return Sample(
        at=now,
        requests=requests,
        backend_requests={b.url: float(b.requests) for b in proxy.pool},
        decisions=decisions,
        ttft=tuple(sorted(ttft.items())),
    )


def _samples(metric: MetricWrapperBase, suffix: str) -> Iterable[Any]:
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith(suffix):
                yield s


def ui_state(proxy: ProxyApp, history: SampleHistory, decisions_limit: int) -> dict[str, Any]:
    """Everything the page draws, in one document."""
    now = proxy.clock()
    current = read_sample(proxy, now)
    recent = history.baseline(now, RATE_WINDOW_S)
    slow = history.baseline(now, TTFT_WINDOW_S)
    history.add(current)
    backends = backend_status(proxy, now)
    for b in backends:
        b["state"] = _backend_state(b)
        b["requests_per_s"] = (
            None
            if recent is None
            else rate(
                current.backend_requests.get(b["url"], 0.0),
                recent.backend_requests.get(b["url"], 0.0),
                now - recent.at,
            )
        )
    cluster = proxy.cluster.status()
    decisions = proxy.recent_decisions(decisions_limit)
    return {
        "at": time.time(),
        "policy": proxy.runtime.policy.name,
        "fleet": _fleet(backends, current, recent, slow),
        "cluster": cluster if cluster["enabled"] else None,
        "backends": backends,
        "decisions": decisions[::-1],
    }


def _backend_state(b: dict[str, Any]) -> str:
    if not b["healthy"]:
        return "unhealthy"
    if b["ejected"]:
        return "ejected"
    if b["draining"]:
        return "draining"
    return "healthy"


def _fleet(
    backends: list[dict[str, Any]], current: Sample, recent: Sample | None, slow: Sample | None
) -> dict[str, Any]:
    ttft: Buckets = current.ttft if slow is None else bucket_delta(current.ttft, slow.ttft)
    reasons = sorted(current.decisions.items(), key=lambda kv: (-kv[1], kv[0]))
    requests_per_s: float | None = None
    window_s: float | None = None
    if recent is not None:
        window_s = round(current.at - recent.at, 3)
        requests_per_s = rate(current.requests, recent.requests, current.at - recent.at)
    return {
        "backends": len(backends),
        "healthy": sum(b["state"] == "healthy" for b in backends),
        "requests_total": current.requests,
        "requests_per_s": requests_per_s,
        "rate_window_s": window_s,
        "ttft_window_s": None if slow is None else round(current.at - slow.at, 3),
        "ttft_count": ttft[-1][1] if ttft else 0.0,
        "ttft_p50_s": histogram_quantile(0.5, ttft),
        "ttft_p99_s": histogram_quantile(0.99, ttft),
        "decisions": [
            {
                "reason": reason,
                "total": total,
                "recent": (
                    None if recent is None else delta(total, recent.decisions.get(reason, 0.0))
                ),
            }
            for reason, total in reasons
        ],
    }
