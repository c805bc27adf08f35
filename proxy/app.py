"""The aiohttp application: routes, the request path top to bottom, start, reload, stop.

Request path (one direction): read + parse the body once -> render the prompt and hash its
blocks -> the policy decides (pure) -> forward the original bytes, streaming the answer
back -> record (prefix index, counters, access log, trace).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.admin import admin_routes
from proxy.backends.discovery import from_config as discovery_from_config
from proxy.backends.monitor import BackendMonitor
from proxy.backends.pool import Backend, BackendPool
from proxy.cluster.sync import ClusterSync, default_node_id
from proxy.config import Config, ConfigError, LoadedConfig, load_config
from proxy.errors import ProxyError, error_response
from proxy.forward import HOP_BY_HOP, Forwarder, ForwardResult
from proxy.prompt import (
    PromptConfig,
    PromptError,
    TemplateRegistry,
    TemplateSource,
    block_hashes,
    routing_text,
)
from proxy.requests import ENDPOINTS, ParsedRequest, parse_request, read_body
from proxy.routing.index import PrefixIndex
from proxy.routing.policy import Policy
from proxy.routing.views import BackendView, Decision, RequestView
from proxy.telemetry.access_log import AccessLog
from proxy.telemetry.metrics import ProxyMetrics
from proxy.telemetry.tracing import Tracing
from proxy.ui import ui_routes

log = logging.getLogger("prefix_proxy")

DEBUG_HEADER = "X-Prefix-Proxy-Debug"
DECISION_HEADER = "X-Prefix-Proxy-Decision"


@dataclass(frozen=True, slots=True)
class Runtime:
    """Everything a reload replaces, swapped in one assignment so a request sees one version."""

    config: Config
    policy: Policy
    templates: TemplateRegistry
    api_keys: frozenset[str]
    block_tokens: float

    @classmethod
    def build(cls, loaded: LoadedConfig) -> Runtime:
        cfg = loaded.config
        return cls(
            config=cfg,
            policy=loaded.policy,
            templates=TemplateRegistry(prompt_config(cfg, loaded.source)),
            api_keys=cfg.api_keys(),
            block_tokens=cfg.prompt.block_chars / cfg.prompt.chars_per_token,
        )


def prompt_config(cfg: Config, source: str | None) -> PromptConfig:
    base = Path(source).parent if source else Path.cwd()
    templates = {}
    for model, m in cfg.models.items():
        if m.chat_template is not None:
            templates[model] = TemplateSource(inline=m.chat_template)
        elif m.chat_template_file is not None:
            templates[model] = TemplateSource(file=str(base / m.chat_template_file))
        elif m.tokenizer_config is not None:
            templates[model] = TemplateSource(tokenizer_config=str(base / m.tokenizer_config))
    return PromptConfig(
        block_chars=cfg.prompt.block_chars, max_blocks=cfg.prompt.max_blocks, templates=templates
    )


class ProxyApp:
    def __init__(self, loaded: LoadedConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.loaded = loaded
        self.runtime = Runtime.build(loaded)
        self.clock = clock
        cfg = loaded.config
        self.metrics = ProxyMetrics()
        self.pool = BackendPool(cfg.health, cfg.scrape)
        self.index = PrefixIndex(
            max(1, int(cfg.index.default_capacity_tokens / self.runtime.block_tokens))
        )
        self.metrics.watch(self.pool, self.index, clock)
        self.access_log = AccessLog(enabled=cfg.telemetry.access_log)
        self.tracing = Tracing.from_config(cfg.telemetry.tracing)
        self.cluster = ClusterSync(
            dataclasses.replace(cfg.cluster, redis_url=cfg.cluster_redis_url()),
            self.index,
            self.metrics,
            default_node_id(),
            inflight=lambda: {b.url: b.inflight for b in self.pool},
        )
        self.decisions: deque[tuple[str, str, int, Decision]] = deque(
            maxlen=cfg.telemetry.recent_decisions
        )
        self.seq = 0
        self.session: aiohttp.ClientSession | None = None
        self.monitor: BackendMonitor | None = None
        self.forwarder: Forwarder | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._discovery_task: asyncio.Task[None] | None = None
        self._reaper_task: asyncio.Task[None] | None = None
        self._leaving: set[str] = set()
        self._probes: set[asyncio.Task[None]] = set()
        self._config_mtime: float | None = None
        for url in cfg.backends.static:
            self.pool.add(url, clock())
        self.web = self._build_web_app()

    # Wiring

    def _build_web_app(self) -> web.Application:
        app = web.Application(client_max_size=self.runtime.config.limits.max_body_bytes)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/v1/models", self.list_models)
        for path in ENDPOINTS:
            app.router.add_post(path, self.inference)
        app.router.add_route("*", "/v1/{tail:.*}", self.passthrough)
        app.router.add_routes(admin_routes(self))
        app.router.add_routes(ui_routes(self))
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4096, ttl_dns_cache=10),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        self.forwarder = Forwarder(self.session, self.pool, self.metrics, self.clock)
        self.monitor = BackendMonitor(
            self.pool,
            self.session,
            on_capacity=self._set_capacity,
            on_template=self._set_backend_template,
            on_scrape=self._count_scrape,
            clock=self.clock,
        )
        await self.monitor.start()
        self._start_discovery()
        self._reaper_task = asyncio.create_task(self._reap_leaving())
        if self.loaded.source:
            self._watch_task = asyncio.create_task(self._watch_config_file())
        await self.cluster.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.cluster.stop()
        for task in (self._watch_task, self._discovery_task, self._reaper_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.monitor is not None:
            await self.monitor.stop()
        if self.session is not None:
            await self.session.close()
        await self.tracing.shutdown()

    # Discovery: backends join cold, leave by draining, and their index entries go with them.

    def _start_discovery(self) -> None:
        if self._discovery_task is not None:
            self._discovery_task.cancel()
        source = discovery_from_config(self.runtime.config.backends)
        if source is not None:
            self._discovery_task = asyncio.create_task(source.run(self._on_discovered))

    def _on_discovered(self, urls: frozenset[str]) -> None:
        gone = self.pool.set_targets(urls, self.clock())
        self._leaving.difference_update(u.rstrip("/") for u in urls)
        self._leaving.update(gone)
        if self.monitor is not None:
            for url in urls:
                backend = self.pool.get(url.rstrip("/"))
                if backend is not None and backend.load is None:
                    task = asyncio.create_task(self.monitor.check(backend))
                    self._probes.add(task)
                    task.add_done_callback(self._probes.discard)

    async def _reap_leaving(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for url in [
                u for u in self._leaving if (b := self.pool.get(u)) is None or b.inflight == 0
            ]:
                self._leaving.discard(url)
                if self.pool.remove(url) is not None:
                    self.index.remove_backend(url)

    def _set_capacity(self, url: str, tokens: int) -> None:
        self.index.set_capacity(url, max(1, int(tokens / self.runtime.block_tokens)))

    def _set_backend_template(self, model: str, source: str, bos: str, eos: str) -> None:
        """Use llama.cpp's own template; one that does not compile keeps the built-in one."""
        try:
            self.runtime.templates.set_backend_template(model, source, bos, eos)
        except PromptError as e:
            log.warning("backend template for %s rejected, keeping the default: %s", model, e)

    def _count_scrape(self, b: Backend, outcome: str, problems: tuple[str, ...]) -> None:
        self.metrics.scrapes.labels(b.url, outcome).inc()
        for p in problems:
            self.metrics.scrape_problems.labels(b.url, p).inc()

    # Plain endpoints

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        healthy = self.pool.healthy_count()
        status = 200 if healthy else 503
        return web.json_response(
            {"ready": bool(healthy), "healthy_backends": healthy}, status=status
        )

    async def prometheus(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def list_models(self, request: web.Request) -> web.Response:
        """The union of the healthy backends' /v1/models, each model once."""
        if (denied := self._authorize(request)) is not None:
            return denied
        assert self.session is not None
        backends = [b for b in self.pool if b.healthy and not b.circuit_open and not b.draining]
        timeout = aiohttp.ClientTimeout(total=self.runtime.config.health.timeout_s)

        async def fetch(b: Backend) -> list[Any]:
            try:
                async with self.session.get(b.url + "/v1/models", timeout=timeout) as r:
                    if r.status != 200:
                        return [{"id": m, "object": "model"} for m in sorted(b.models)]
                    data = orjson.loads(await r.read()).get("data", [])
                    return data if isinstance(data, list) else []
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, AttributeError):
                return [{"id": m, "object": "model"} for m in sorted(b.models)]

        seen: dict[str, Any] = {}
        for models in await asyncio.gather(*(fetch(b) for b in backends)):
            for m in models:
                if isinstance(m, dict) and isinstance(m.get("id"), str):
                    seen.setdefault(m["id"], m)
        return web.json_response({"object": "list", "data": list(seen.values())})

    # The request path

    async def inference(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, ENDPOINTS[request.path])

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "other")

    async def _serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        started = self.clock()
        rt = self.runtime
        rid = request.headers.get("X-Request-ID") or os.urandom(16).hex()
        reply_headers = {"X-Request-ID": rid}
        trace = self.tracing.start_request(request.headers, endpoint, request.method, request.path)
        result = ForwardResult(trace=trace)
        model = ""
        decision: Decision | None = None
        view: RequestView | None = None
        status = 0
        try:
            if (denied := self._authorize(request, reply_headers)) is not None:
                status = denied.status
                self.metrics.rejected.labels("unauthorized").inc()
                return denied
            raw = await read_body(
                request, rt.config.limits.max_body_bytes, rt.config.limits.body_timeout_s
            )
            route_start = time.perf_counter()
            parsed = self._parse(endpoint, raw, request.method)
            model = parsed.model if parsed else ""
            view = self._request_view(rt, request, parsed)
            decision = rt.policy.decide(view, self._views(view.now), self.index)
            self.metrics.routing_seconds.observe(time.perf_counter() - route_start)
            self.metrics.decisions.labels(rt.policy.name, decision.reason).inc()
            result.trace.set_decision(model, rt.policy.name, decision, len(view.block_hashes))
            if not decision.ranked:
                raise self._no_route(decision, model)
            if rt.config.telemetry.debug_header and request.headers.get(DEBUG_HEADER):
                reply_headers[DECISION_HEADER] = orjson.dumps(_decision_summary(decision)).decode()
            self._remember(rid, model, view, decision)
            if view.block_hashes:
                # The chosen engine starts on this prompt now: the next request of a burst
                # that shares it should find it there, not wait for this one's first byte.
                self.index.insert(decision.ranked[0], view.block_hashes)
            assert self.forwarder is not None
            resp = await self.forwarder.forward(
                request,
                raw,
                decision.ranked,
                rt.config.upstream,
                self._upstream_headers(request, rt, rid),
                lambda b: self._on_commit(b, view, decision, endpoint, started),
                reply_headers,
                result,
            )
            status = resp.status
            return resp
        except ProxyError as e:
            status = e.status
            self.metrics.rejected.labels(e.code).inc()
            return e.response(reply_headers)
        finally:
            self._record(rid, endpoint, model, started, status, result, view, decision)
            result.trace.end(status, result)

    def _views(self, now: float) -> list[BackendView]:
        if not self.runtime.config.cluster.share_inflight:
            return self.pool.views(now)
        return self.pool.views(now, self.cluster.remote_inflight)

    def _parse(self, endpoint: str, raw: bytes, method: str) -> ParsedRequest | None:
        if endpoint == "other" and (method in ("GET", "HEAD", "DELETE") or not raw):
            return None
        if endpoint == "other":
            try:
                return parse_request(endpoint, raw)
            except ProxyError:
                return None
        return parse_request(endpoint, raw)

    def _request_view(
        self, rt: Runtime, request: web.Request, parsed: ParsedRequest | None
    ) -> RequestView:
        self.seq += 1
        now = self.clock()
        if parsed is None:
            return RequestView("", (), rt.block_tokens, 0, None, self.seq, now)
        prompt = rt.config.prompt
        try:
            text = routing_text(parsed.endpoint, parsed.body, rt.templates)
        except PromptError as e:
            raise ProxyError(400, str(e), "invalid_prompt") from None
        hashes: list[int] = []
        if text:
            hashes = block_hashes(text, prompt.block_chars, prompt.max_blocks, _salt(rt, request))
        session = request.headers.get(prompt.session_header)
        if session is None:
            user = parsed.body.get("user")
            session = f"user:{user}" if isinstance(user, str) and user else parsed.conversation_key
        tokens = int(len(text) / prompt.chars_per_token) if text else 0
        return RequestView(parsed.model, hashes, rt.block_tokens, tokens, session, self.seq, now)

    def _no_route(self, decision: Decision, model: str) -> ProxyError:
        if decision.reason == "filtered_serves_model":
            return ProxyError(
                404, f"model {model!r} is not served by any backend", "model_not_found", "model"
            )
        if decision.reason == "filtered_not_draining":
            return ProxyError(503, "all backends serving this model are draining", "draining")
        return ProxyError(503, "no healthy backend", "no_healthy_backend")

    def _authorize(
        self, request: web.Request, headers: dict[str, str] | None = None
    ) -> web.Response | None:
        keys = self.runtime.api_keys
        if not keys:
            return None
        given = request.headers.get("Authorization", "")
        token = given[7:] if given.startswith("Bearer ") else ""
        if any(hmac.compare_digest(token.encode(), k.encode()) for k in keys):
            return None
        return error_response(401, "invalid or missing API key", "invalid_api_key", headers=headers)

    def _upstream_headers(self, request: web.Request, rt: Runtime, rid: str) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["X-Request-ID"] = rid
        mode = rt.config.upstream.authorization
        if mode == "drop" or (rt.api_keys and mode == "pass"):
            headers.pop("Authorization", None)
        elif mode == "replace":
            headers["Authorization"] = f"Bearer {rt.config.upstream_token()}"
        return headers

    def _on_commit(
        self,
        backend: Backend,
        view: RequestView,
        decision: Decision,
        endpoint: str,
        started: float,
    ) -> None:
        """The first byte is in hand: the engine has this prompt now; tell the peers."""
        self.metrics.ttft.labels(endpoint).observe(self.clock() - started)
        backend.requests += 1
        if view.block_hashes:
            matched = decision.matched_blocks.get(backend.url, 0)
            if backend.url != decision.ranked[0]:  # a retry landed elsewhere
                self.index.insert(backend.url, view.block_hashes)
            self.cluster.publish(backend.url, view.block_hashes)
            self.metrics.match_ratio.observe(matched / len(view.block_hashes))
            backend.predicted_hit_tokens += min(view.prompt_tokens, matched * view.block_tokens)
            backend.predicted_prompt_tokens += view.prompt_tokens

    def _remember(self, rid: str, model: str, view: RequestView, decision: Decision) -> None:
        """Keep the decision as it is; it is formatted only when someone looks."""
        self.decisions.append((rid, model, len(view.block_hashes), decision))

    def recent_decisions(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` routing decisions with their reasons, oldest first."""
        recent = list(self.decisions)[-limit:] if limit > 0 else []
        return [
            {"request_id": rid, "model": model, "blocks": blocks} | _decision_summary(decision)
            for rid, model, blocks, decision in recent
        ]

    def _record(
        self,
        rid: str,
        endpoint: str,
        model: str,
        started: float,
        status: int,
        result: ForwardResult,
        view: RequestView | None,
        decision: Decision | None,
    ) -> None:
        now = self.clock()
        backend = result.backend.url if result.backend else ""
        status_label = "aborted" if result.client_aborted and not status else str(status)
        self.metrics.requests.labels(endpoint, model, backend, status_label).inc()
        self.metrics.duration.labels(endpoint).observe(now - started)
        self.access_log.write(
            request_id=rid,
            endpoint=endpoint,
            model=model,
            backend=backend,
            status=status,
            ttft_s=(result.first_byte_at - started) if result.first_byte_at else None,
            duration_s=now - started,
            prompt_blocks=len(view.block_hashes) if view else 0,
            matched_blocks=(decision.matched_blocks.get(backend, 0) if decision else 0),
            reason=decision.reason if decision else None,
            attempts=result.attempts,
            error=result.error_kind,
            client_aborted=result.client_aborted,
        )

    # Reload

    def reload(self, loaded: LoadedConfig | None = None) -> None:
        """Swap config and policy atomically; an invalid file keeps the old ones."""
        try:
            if loaded is None:
                if not self.loaded.source:
                    raise ConfigError("", "no config file to reload")
                loaded = load_config(self.loaded.source, self.loaded.overrides)
            runtime = Runtime.build(loaded)
        except (ConfigError, OSError) as e:
            self.metrics.config_reloads.labels("rejected").inc()
            log.error("config reload rejected, keeping the old config: %s", e)
            raise
        old = self.runtime
        self.loaded, self.runtime = loaded, runtime
        for b in self.pool:
            b.templates_from_props = False  # the new registry learns llama.cpp templates again
        if loaded.config.backends != old.config.backends:
            self._start_discovery()
        self.metrics.config_reloads.labels("ok").inc()
        log.info("config reloaded: policy %s", runtime.policy.name)

    async def _watch_config_file(self) -> None:
        path = Path(self.loaded.source or "")
        with contextlib.suppress(OSError):
            self._config_mtime = path.stat().st_mtime
        while True:
            await asyncio.sleep(2.0)
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if mtime != self._config_mtime:
                self._config_mtime = mtime
                with contextlib.suppress(ConfigError, OSError):
                    self.reload()


def _salt(rt: Runtime, request: web.Request) -> bytes | None:
    prompt = rt.config.prompt
    tenant = request.headers.get(prompt.tenant_header) if prompt.tenant_header else None
    if not tenant and not prompt.tenant_salt:
        return None
    return f"{prompt.tenant_salt or ''}\x00{tenant or ''}".encode()


def _decision_summary(decision: Decision) -> dict[str, Any]:
    return {
        "backend": decision.ranked[0] if decision.ranked else None,
        "reason": decision.reason,
        "matched_blocks": decision.matched_blocks,
        "scores": {b: {k: round(v, 4) for k, v in s.items()} for b, s in decision.scores.items()},
        "total": {b: round(v, 4) for b, v in decision.total.items()},
    }
