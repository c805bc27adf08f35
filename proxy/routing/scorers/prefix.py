from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class PrefixScorer:
    """Share of the prompt's blocks a backend already holds: prefill it will not redo."""

    weight: float = 1.0
    name: str = "prefix"

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        n = len(req.block_hashes)
        if n == 0:
            return [0.0] * len(backends)
        return [m / n for m in matched]
