from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.load import queued
from proxy.routing.scorers.base import inverse
from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class QueueScorer:
    """Requests waiting for a batch slot (scraped, plus what this proxy sent since)."""

    weight: float = 1.0
    scale: float = 4.0
    name: str = "queue"

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        return [inverse(queued(b), self.scale) for b in backends]
