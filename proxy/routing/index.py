"""Prefix index: which backends most likely still hold a block chain in their KV cache.

Each backend has its own LRU of block hashes, sized to that engine's real KV capacity.
Because block hashes are chained, a backend that holds block ``i`` of a prompt holds blocks
``0..i`` too, so the longest match is found by binary search over the chain instead of a
walk. Blocks are touched leaf first and root last, so that, as in vLLM and SGLang, the tail
of an old conversation is evicted before the system prompt it shares with newer ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class PrefixIndex:
    """Block hash -> backends believed to hold it, with per-backend LRU capacity."""

    def __init__(self, default_capacity_blocks: int) -> None:
        if default_capacity_blocks < 1:
            raise ValueError("default_capacity_blocks must be >= 1")
        self._default_capacity = default_capacity_blocks
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}

    def set_capacity(self, backend: str, blocks: int) -> None:
        """Follow the engine's real KV capacity; shrinking evicts at once."""
        self._capacity[backend] = max(1, blocks)
        lru = self._lru.get(backend)
        if lru is not None:
            self._evict(lru, self._capacity[backend])

    def capacity(self, backend: str) -> int:
        return self._capacity.get(backend, self._default_capacity)

    def remove_backend(self, backend: str) -> None:
        self._lru.pop(backend, None)
        self._capacity.pop(backend, None)

    def backends(self) -> list[str]:
        return list(self._lru)

    def insert(self, backend: str, hashes: Sequence[int]) -> None:
        """Record that ``backend`` now holds the chain ``hashes`` (root first)."""
        lru = self._lru.get(backend)
        if lru is None:
            lru = self._lru[backend] = OrderedDict()
        move = lru.move_to_end
        for h in reversed(hashes):
            if h in lru:
                move(h)
            else:
                lru[h] = None
        self._evict(lru, self._capacity.get(backend, self._default_capacity))

    def match(self, backend: str, hashes: Sequence[int]) -> int:
        """Number of leading blocks of ``hashes`` that ``backend`` holds."""
        lru = self._lru.get(backend)
        if not lru or not hashes:
            return 0
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if hashes[mid - 1] in lru:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def match_all(self, backends: Iterable[str], hashes: Sequence[int]) -> dict[str, int]:
        return {b: self.match(b, hashes) for b in backends}

    def size(self, backend: str | None = None) -> int:
        """Indexed blocks for one backend, or for all of them."""
        if backend is not None:
            return len(self._lru.get(backend, ()))
        return sum(len(lru) for lru in self._lru.values())

    def recent(self, backend: str, limit: int) -> list[int]:
        """The ``limit`` most recently used hashes of ``backend`` (for snapshots to peers)."""
        lru = self._lru.get(backend)
        if not lru:
            return []
        out: list[int] = []
        for h in reversed(lru):
            if len(out) >= limit:
                break
            out.append(h)
        out.reverse()
        return out

    @staticmethod
    def _evict(lru: OrderedDict[int, None], capacity: int) -> None:
        pop = lru.popitem
        while len(lru) > capacity:
            pop(last=False)
