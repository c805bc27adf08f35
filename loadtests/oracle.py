"""Cache hit rates from simulator records: what happened, and the best routing could do.

Records are the per-request rows of the replicas' GET /sim/stats (all replicas of one run,
same ``block_tokens``). Block hashes chain from the same root on every replica, so the
union of all replicas' hashes says which prefixes any replica could have held.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from loadtests.simulator.cache import lookup_limit


def true_hit_rate(records: Iterable[Mapping[str, Any]]) -> float:
    """Share of prompt tokens the replicas actually served from cache."""
    rows = list(records)
    prompt = sum(r["prompt_tokens"] for r in rows)
    return sum(r["cached_tokens"] for r in rows) / prompt if prompt else 0.0


def oracle_hit_rate(records: Iterable[Mapping[str, Any]], block_tokens: int) -> float:
    """Share of prompt tokens that could hit if every request went to a replica holding its
    longest earlier prefix, with unbounded cache.

    Requests are taken in arrival order; each may hit the leading blocks that any earlier
    request's prompt (or, when recorded, its generated text) produced, up to the same
    "last token is always computed" limit the replicas apply.
    """
    seen: set[int] = set()
    prompt = hit = 0
    for r in sorted(records, key=lambda r: r["arrival_unix"]):
        hashes = r["block_hashes"]
        matched = 0
        for h in hashes[: lookup_limit(r["prompt_tokens"], block_tokens)]:
            if h not in seen:
                break
            matched += 1
        hit += matched * block_tokens
        prompt += r["prompt_tokens"]
        seen.update(hashes)
        seen.update(r.get("output_block_hashes") or ())
    return hit / prompt if prompt else 0.0
