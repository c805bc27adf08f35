"""The replica's prefix cache: chained block hashes with LRU eviction, leaf first.

Like vLLM's block pool, a hit is the longest run of leading blocks present, and a request
always computes at least its last prompt token, so at most ``(prompt_tokens - 1) //
block_tokens`` blocks can hit. Blocks held by running requests are not pinned (a
simplification: under heavy pressure the simulator evicts a little earlier than vLLM).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def lookup_limit(prompt_tokens: int, block_tokens: int) -> int:
    """How many leading blocks a request of ``prompt_tokens`` tokens may take from cache."""
    return max(0, (prompt_tokens - 1) // block_tokens)


class PrefixCache:
    """Block hashes in recency order; the front of the dict is evicted first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """Count the leading cached blocks (at most ``limit``) and mark them recently used."""
        matched = 0
        for h in hashes[:limit]:
            if h not in self._blocks:
                break
            matched += 1
        self._touch(hashes[:matched])
        return matched

    def insert(self, hashes: Sequence[int]) -> None:
        """Cache a chain; touched leaf to root so the root is the most recent."""
        self._touch(hashes)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        self._blocks.clear()
        self.evictions = 0

    def _touch(self, hashes: Sequence[int]) -> None:
        blocks = self._blocks
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
