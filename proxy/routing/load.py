"""Fuse the lagging scraped engine load with the proxy's live in-flight count.

A scrape says what the engine was doing up to one interval ago, for every proxy in front of
it; the proxy's own in-flight count is exact and instant but only covers this proxy. The
estimate below takes the scraped figure and adds what this proxy sent (or finished) since
that scrape, and never goes below what this proxy alone has outstanding.
"""

from __future__ import annotations

from proxy.routing.views import BackendView


def fresh_load(b: BackendView) -> bool:
    return b.load is not None and not b.load_stale


def outstanding(b: BackendView) -> float:
    """Requests running or waiting on the engine, from all proxies."""
    load = b.load
    if load is None or b.load_stale or load.running is None:
        return float(b.inflight)
    scraped = load.running + (load.waiting or 0.0)
    return max(float(b.inflight), scraped + b.inflight - b.inflight_at_scrape)


def queued(b: BackendView) -> float:
    """Requests waiting for a batch slot; unknown (0) without a fresh scrape."""
    load = b.load
    if load is None or b.load_stale or load.waiting is None:
        return 0.0
    return max(0.0, load.waiting + max(0, b.inflight - b.inflight_at_scrape))
