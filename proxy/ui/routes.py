"""Routes of the status page; the page and the tests read the same JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from proxy.app import ProxyApp


def ui_routes(proxy: ProxyApp) -> list[web.RouteDef]:
    return []
