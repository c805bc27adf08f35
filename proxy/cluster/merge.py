"""Merging several peers' snapshots of one backend into one recency order.

Each snapshot lists a backend's most recently used blocks as one proxy saw them, oldest
first. Inserting the snapshots one after another would let the last one read push the
others out of a capacity-limited LRU; interleaving them by recency rank (everyone's newest
block first, then everyone's second newest, ...) keeps what any peer used recently.
"""

from __future__ import annotations

from collections.abc import Sequence


def merge_recent(snapshots: Sequence[Sequence[int]], limit: int) -> list[int]:
    """At most ``limit`` distinct hashes, oldest first; ``snapshots`` freshest first."""
    newest_first: dict[int, None] = {}
    longest = max((len(s) for s in snapshots), default=0)
    for rank in range(1, longest + 1):
        for s in snapshots:
            if rank <= len(s):
                newest_first.setdefault(s[-rank], None)
                if len(newest_first) >= limit:
                    return list(reversed(newest_first))
    return list(reversed(newest_first))
