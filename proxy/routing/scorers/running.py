from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.load import outstanding
from proxy.routing.scorers.base import inverse
from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class RunningScorer:
    """All requests on the engine (running + waiting, from every proxy), fused with live counts."""

    weight: float = 1.0
    scale: float = 8.0
    name: str = "running"

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        return [inverse(outstanding(b), self.scale) for b in backends]
