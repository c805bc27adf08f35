from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.load import fresh_load
from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class KvUsageScorer:
    """Free KV cache: a full cache means preemption and eviction of the prefixes we count on.

    A backend without a fresh KV figure gets ``unknown`` so that missing data neither wins nor
    loses outright.
    """

    weight: float = 1.0
    unknown: float = 0.5
    name: str = "kv_usage"

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        out = []
        for b in backends:
            usage = b.load.kv_usage if fresh_load(b) and b.load is not None else None
            out.append(self.unknown if usage is None else 1.0 - min(1.0, max(0.0, usage)))
        return out
