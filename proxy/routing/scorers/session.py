from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.rendezvous import rendezvous_order
from proxy.routing.views import BackendView, RequestView


@dataclass(slots=True)
class SessionScorer:
    """Keeps a session on one backend, chosen by rendezvous hashing of its key.

    Rendezvous (highest random weight) hashing needs no shared state: every proxy replica
    ranks the same candidates the same way, and removing a backend moves only its sessions.
    """

    weight: float = 1.0
    name: str = "session"

    def score(
        self, req: RequestView, backends: Sequence[BackendView], matched: Sequence[int]
    ) -> list[float]:
        if req.session_key is None or not backends:
            return [0.0] * len(backends)
        first = rendezvous_order(req.session_key, [b.id for b in backends])[0]
        return [1.0 if i == first else 0.0 for i in range(len(backends))]
