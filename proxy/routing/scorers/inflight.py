from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.scorers.base import inverse
from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class InflightScorer:
    """This proxy's own outstanding requests: exact and instant, blind to other proxies."""

    weight: float = 1.0
    scale: float = 4.0
    name: str = "inflight"

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        return [inverse(b.inflight, self.scale) for b in backends]
