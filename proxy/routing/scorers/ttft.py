from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.load import outstanding
from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class TtftScorer:
    """Cost mode: expected time to first token, in milliseconds, on each backend.

    ``expected = uncached_tokens * prefill_ms_per_1k_tokens / 1000
    + outstanding_requests * queue_ms_per_request``: prefill we would have to redo plus the
    wait behind the work already there, in one unit. The score is ``(best + floor) /
    (expected + floor)``, so the cheapest backend scores 1 and a backend twice as slow about
    0.5; ``floor_ms`` keeps tiny differences from looking large.
    """

    weight: float = 1.0
    prefill_ms_per_1k_tokens: float = 60.0
    queue_ms_per_request: float = 25.0
    floor_ms: float = 5.0
    name: str = "ttft"

    def expected_ms(self, req: RequestView, b: BackendView, matched: int) -> float:
        uncached_tokens = max(0.0, req.prompt_tokens - matched * req.block_tokens)
        return (
            uncached_tokens * self.prefill_ms_per_1k_tokens / 1000.0
            + outstanding(b) * self.queue_ms_per_request
        )

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        costs = [self.expected_ms(req, b, m) for b, m in zip(backends, matched, strict=True)]
        if not costs:
            return []
        best = min(costs) + self.floor_ms
        return [best / (c + self.floor_ms) for c in costs]
