"""Filters: which backends may take a request at all."""

from __future__ import annotations

from collections.abc import Callable

from proxy.routing.views import BackendView, RequestView

Filter = Callable[[RequestView, BackendView], bool]


def healthy(req: RequestView, b: BackendView) -> bool:
    return b.healthy


def serves_model(req: RequestView, b: BackendView) -> bool:
    """A request naming no model (a pass-through GET) and a backend whose model list is not
    known yet both match anything."""
    return not req.model or not b.models or req.model in b.models


def not_draining(req: RequestView, b: BackendView) -> bool:
    return not b.draining


def circuit_closed(req: RequestView, b: BackendView) -> bool:
    return not b.circuit_open


FILTERS: dict[str, Filter] = {
    "healthy": healthy,
    "serves_model": serves_model,
    "not_draining": not_draining,
    "circuit_closed": circuit_closed,
}
