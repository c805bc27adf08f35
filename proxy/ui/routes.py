"""Routes of the status page: GET /ui (the page) and GET /ui/state (the JSON it polls).

Access: with an admin token configured (admin.token or its env variable) both routes want it.
A browser cannot send a bearer header when it navigates, so /ui also takes it as
``?token=``; the page then moves it out of the address bar into the tab's sessionStorage and
sends it on its polls as ``Authorization: Bearer``, the only form /ui/state accepts (so the
token is not written into every access log line a poll makes). With no admin token
configured the page is open: it is read-only and shows what /metrics already shows to
anyone who can reach the proxy, whereas the admin API, which changes things, stays off.

With several worker processes each answers for itself: the page shows the worker it hit.
"""

from __future__ import annotations

import hmac
from importlib.resources import files
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from proxy.errors import error_response
from proxy.ui.state import TTFT_WINDOW_S, ui_state
from proxy.ui.window import SampleHistory

if TYPE_CHECKING:
    from proxy.app import ProxyApp

DEFAULT_DECISIONS = 20

PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
}


def ui_routes(proxy: ProxyApp) -> list[web.RouteDef]:
    page = StatusPage(proxy)
    return [
        web.get("/ui", page.page),
        web.get("/ui/", page.page),
        web.get("/ui/state", page.state),
    ]


class StatusPage:
    def __init__(self, proxy: ProxyApp) -> None:
        self.proxy = proxy
        self.history = SampleHistory(keep_s=TTFT_WINDOW_S + 5.0)
        self.html = files("proxy.ui").joinpath("status.html").read_bytes()

    async def page(self, request: web.Request) -> web.Response:
        if (denied := self._refusal(request, allow_query=True)) is not None:
            return denied
        return web.Response(
            body=self.html, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
        )

    async def state(self, request: web.Request) -> web.Response:
        if (denied := self._refusal(request, allow_query=False)) is not None:
            return denied
        limit = self.proxy.decisions.maxlen or 0
        raw = request.query.get("decisions", str(DEFAULT_DECISIONS))
        if not (raw.isascii() and raw.isdigit()):
            return error_response(
                400, "'decisions' must be a whole number", "invalid_parameter", "decisions"
            )
        doc = ui_state(self.proxy, self.history, min(int(raw), limit))
        return web.Response(
            body=orjson.dumps(doc),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    def _refusal(self, request: web.Request, allow_query: bool) -> web.Response | None:
        """None when no admin token is configured or the request carries it."""
        token = self.proxy.runtime.config.admin_token()
        if not token:
            return None
        given = request.headers.get("Authorization", "")
        presented = given[7:] if given.startswith("Bearer ") else ""
        if not presented and allow_query:
            presented = request.query.get("token", "")
        if hmac.compare_digest(presented.encode(), token.encode()):
            return None
        hint = "open /ui?token=<admin token>" if allow_query else "send it as a bearer token"
        return error_response(401, f"admin token required: {hint}", "invalid_admin_token")
