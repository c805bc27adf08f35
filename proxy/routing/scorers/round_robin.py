from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class RoundRobinScorer:
    """1 for the candidate whose turn it is (request sequence number modulo candidates)."""

    weight: float = 1.0
    name: str = "round_robin"

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        if not backends:
            return []
        turn = req.seq % len(backends)
        return [1.0 if i == turn else 0.0 for i in range(len(backends))]
