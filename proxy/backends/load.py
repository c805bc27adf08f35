"""Normalized load of one engine replica, as scraped from its /metrics (and /slots)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """What one scrape learned about a backend, in engine-neutral units.

    Every field is optional: engines expose different subsets and a field the
    engine does not report stays ``None`` rather than a made-up zero.
    """

    dialect: str
    scraped_at: float
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    cache_hit_tokens: float | None = None
    cache_query_tokens: float | None = None
    cache_hit_rate: float | None = None
