"""Rendezvous (highest-random-weight) hashing: stable placement without shared state."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash


def rendezvous_order(key: str, backends: Sequence[str]) -> list[int]:
    """Indexes of ``backends`` from most to least preferred for ``key``."""
    seed = xxhash.xxh3_64_intdigest(key.encode())
    weights = [xxhash.xxh3_64_intdigest(b.encode(), seed=seed) for b in backends]
    return sorted(range(len(backends)), key=weights.__getitem__, reverse=True)
