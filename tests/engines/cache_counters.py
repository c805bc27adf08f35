"""The engines' own prefix-cache counters, read the way the proxy reads them."""

from __future__ import annotations

import aiohttp

from proxy.backends.metrics import parse_metrics


async def prefix_cache_counters(
    session: aiohttp.ClientSession, urls: list[str]
) -> tuple[float, float]:
    """(tokens served from cache, prompt tokens queried), summed over the replicas' /metrics."""
    hits = queried = 0.0
    for url in urls:
        async with session.get(url + "/metrics") as r:
            snap = parse_metrics(await r.text(), 0.0).engine
        assert snap is not None and snap.cache_hit_tokens is not None
        hits += snap.cache_hit_tokens
        queried += snap.cache_query_tokens or 0.0
    return hits, queried
