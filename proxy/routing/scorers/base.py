"""The one interface every scorer implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from proxy.routing.views import BackendView, RequestView


class Scorer(Protocol):
    """Scores candidates in [0, 1], higher is better; the policy multiplies by ``weight``.

    ``matched`` holds, per candidate and aligned with ``backends``, how many leading blocks
    of the request's prompt the prefix index believes that backend holds.
    """

    name: str
    weight: float

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]: ...


def inverse(x: float, scale: float) -> float:
    """1 at zero, 0.5 at ``scale``, towards 0 beyond: a smooth absolute load score."""
    return 1.0 / (1.0 + max(0.0, x) / scale)
