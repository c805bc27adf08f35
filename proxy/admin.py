"""Admin API under /admin/: inspect and change the backend pool, reload the config.

Refused unless a bearer token is configured (admin.token or $PREFIX_PROXY_ADMIN_TOKEN) and
presented; the comparison is constant-time. With no token configured the API is off.
"""

from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from proxy.config import ConfigError
from proxy.errors import error_response

if TYPE_CHECKING:
    from proxy.app import ProxyApp


def admin_routes(proxy: ProxyApp) -> list[web.RouteDef]:
    api = AdminApi(proxy)
    return [
        web.get("/admin/backends", api.list_backends),
        web.post("/admin/backends", api.add_backend),
        web.delete("/admin/backends", api.remove_backend),
        web.post("/admin/backends/drain", api.drain_backend),
        web.post("/admin/reload", api.reload),
        web.get("/admin/decisions", api.decisions),
    ]


def check_admin_token(proxy: ProxyApp, request: web.Request) -> web.Response | None:
    """None when the request carries the admin token; else the refusal to send."""
    token = proxy.runtime.config.admin_token()
    if not token:
        return error_response(403, "admin API disabled: set admin.token", "admin_disabled")
    given = request.headers.get("Authorization", "")
    presented = given[7:] if given.startswith("Bearer ") else ""
    if not hmac.compare_digest(presented.encode(), token.encode()):
        return error_response(401, "admin token required", "invalid_admin_token")
    return None


def backend_status(proxy: ProxyApp, now: float) -> list[dict[str, Any]]:
    stale_after = proxy.pool.scrape.stale_after_s
    out = []
    for b in proxy.pool:
        load = b.load
        out.append(
            {
                "url": b.url,
                "healthy": b.healthy,
                "ejected": b.circuit_open,
                "draining": b.draining,
                "dialect": b.dialect,
                "models": sorted(b.models),
                "inflight": b.inflight,
                "requests": b.requests,
                "running": load.running if load else None,
                "waiting": load.waiting if load else None,
                "kv_usage": load.kv_usage if load else None,
                "kv_capacity_tokens": load.kv_capacity_tokens if load else None,
                "scrape_age_s": round(now - load.scraped_at, 3) if load else None,
                "load_stale": b.load_stale(now, stale_after),
                "predicted_hit_rate": b.predicted_hit_rate(),
                "engine_hit_rate": b.engine_hit_rate,
                "index_blocks": proxy.index.size(b.url),
                "index_capacity_blocks": proxy.index.capacity(b.url),
            }
        )
    return out


class AdminApi:
    def __init__(self, proxy: ProxyApp) -> None:
        self.proxy = proxy

    async def list_backends(self, request: web.Request) -> web.Response:
        if (denied := check_admin_token(self.proxy, request)) is not None:
            return denied
        return _json(
            {
                "policy": self.proxy.runtime.policy.name,
                "backends": backend_status(self.proxy, self.proxy.clock()),
                "cluster": self.proxy.cluster.status(),
                "chat_templates": {
                    m: self.proxy.runtime.templates.template_for(m).name
                    for m in sorted({m for b in self.proxy.pool for m in b.models})
                },
            }
        )

    async def add_backend(self, request: web.Request) -> web.Response:
        if (denied := check_admin_token(self.proxy, request)) is not None:
            return denied
        url = await _url_from(request)
        if isinstance(url, web.Response):
            return url
        backend = self.proxy.pool.add(url, self.proxy.clock())
        if self.proxy.monitor is not None:
            await self.proxy.monitor.check(backend)
            await self.proxy.monitor.scrape(backend)
        return _json({"added": backend.url, "healthy": backend.healthy}, status=201)

    async def remove_backend(self, request: web.Request) -> web.Response:
        if (denied := check_admin_token(self.proxy, request)) is not None:
            return denied
        url = await _url_from(request)
        if isinstance(url, web.Response):
            return url
        backend = self.proxy.pool.remove(url)
        if backend is None:
            return error_response(404, f"no backend {url}", "backend_not_found")
        self.proxy.index.remove_backend(backend.url)
        return _json({"removed": backend.url, "inflight": backend.inflight})

    async def drain_backend(self, request: web.Request) -> web.Response:
        if (denied := check_admin_token(self.proxy, request)) is not None:
            return denied
        url = await _url_from(request)
        if isinstance(url, web.Response):
            return url
        if not self.proxy.pool.drain(url):
            return error_response(404, f"no backend {url}", "backend_not_found")
        backend = self.proxy.pool.get(url)
        return _json({"draining": url, "inflight": backend.inflight if backend else 0})

    async def reload(self, request: web.Request) -> web.Response:
        if (denied := check_admin_token(self.proxy, request)) is not None:
            return denied
        try:
            self.proxy.reload()
        except (ConfigError, OSError) as e:
            return error_response(400, f"reload rejected, old config kept: {e}", "invalid_config")
        return _json({"reloaded": True, "policy": self.proxy.runtime.policy.name})

    async def decisions(self, request: web.Request) -> web.Response:
        if (denied := check_admin_token(self.proxy, request)) is not None:
            return denied
        limit = self.proxy.decisions.maxlen or 0
        return _json({"decisions": self.proxy.recent_decisions(limit), "at": time.time()})


async def _url_from(request: web.Request) -> str | web.Response:
    url = request.query.get("url")
    if url is None and request.can_read_body:
        try:
            doc = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return error_response(400, 'body must be JSON like {"url": ...}', "invalid_json")
        url = doc.get("url") if isinstance(doc, dict) else None
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return error_response(400, "'url' must be an http(s) URL", "invalid_url", "url")
    return url.rstrip("/")


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")
