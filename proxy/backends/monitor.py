"""Background knowledge of each backend: health, models, scraped load, KV capacity.

Runs beside the request path and only writes into the pool (and the prefix index's
capacities, and the template registry for llama.cpp's own template). Every failure is
logged once per state change and counted, never raised: a broken backend must not take
the monitor down with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp
import orjson

from proxy.backends.llamacpp import parse_props, parse_slots, with_slot_load
from proxy.backends.metrics import engine_hit_rate, parse_metrics
from proxy.backends.pool import Backend, BackendPool

log = logging.getLogger("prefix_proxy.monitor")

MAX_METRICS_BYTES = 8 * 1024 * 1024
Clock = Callable[[], float]
CapacityHook = Callable[[str, int], None]
TemplateHook = Callable[[str, str, str, str], None]
ScrapeHook = Callable[[Backend, str, tuple[str, ...]], None]


class BackendMonitor:
    """Periodic health checks, model listing and metrics scraping for every backend."""

    def __init__(
        self,
        pool: BackendPool,
        session: aiohttp.ClientSession,
        *,
        on_capacity: CapacityHook,
        on_template: TemplateHook,
        on_scrape: ScrapeHook,
        clock: Clock = time.monotonic,
    ) -> None:
        self.pool = pool
        self.session = session
        self.on_capacity = on_capacity
        self.on_template = on_template
        self.on_scrape = on_scrape
        self.clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._models_checked: dict[str, float] = {}

    async def start(self) -> None:
        """Probe every backend once (so the first request sees a real picture), then loop."""
        await self.refresh_all()
        self._tasks = [
            asyncio.create_task(self._every(self.pool.health.interval_s, self.check_all)),
            asyncio.create_task(self._every(self.pool.scrape.interval_s, self.scrape_all)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def refresh_all(self) -> None:
        await self.check_all()
        await self.scrape_all()

    async def _every(self, interval: float, job: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()  # type: ignore[misc]
            except Exception:  # a bug here must not stop the loop
                log.exception("monitor job failed")

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(b) for b in self.pool))

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(b) for b in self.pool))

    async def check(self, b: Backend) -> None:
        """Active health: /health answers 200. Also the half-open probe of an ejected backend."""
        ok = await self._get_ok(b.url + "/health", self.pool.health.timeout_s)
        now = self.clock()
        if ok != b.healthy:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "backend %s: %s",
                b.url,
                "healthy" if ok else "unhealthy",
            )
        b.healthy = ok
        if ok and self.pool.due_for_probe(b, now):
            self.pool.record_success(b)
        if (
            ok
            and now - self._models_checked.get(b.url, -1e18) >= self.pool.health.models_interval_s
        ) and await self.fetch_models(b):
            self._models_checked[b.url] = now

    async def fetch_models(self, b: Backend) -> bool:
        body = await self._get_body(b.url + "/v1/models", self.pool.health.timeout_s)
        if body is None:
            return False
        try:
            doc = orjson.loads(body)
            ids = frozenset(
                m["id"] for m in doc["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)
            )
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("backend %s: unreadable /v1/models", b.url)
            return False
        if ids != b.models:
            log.info("backend %s serves %s", b.url, sorted(ids))
        b.models = ids
        return True

    async def scrape(self, b: Backend) -> None:
        body = await self._get_body(b.url + "/metrics", self.pool.scrape.timeout_s)
        inflight_then = b.inflight
        now = self.clock()
        if body is None:
            self._scrape_failed(b, "unreachable")
            return
        reading = parse_metrics(body, now)
        snap = reading.engine
        if snap is None:
            self._scrape_failed(b, "unparseable", reading.problems)
            return
        if reading.dialect == "llamacpp":
            snap = await self._complete_llamacpp(b, snap)
        b.prev_load = b.load
        b.load = snap
        b.inflight_at_scrape = inflight_then
        b.dialect = reading.dialect
        if not b.last_scrape_ok:
            log.info("backend %s: metrics scrape ok (%s)", b.url, reading.dialect)
        b.last_scrape_ok = True
        b.scrape_problems = reading.problems
        if snap.cache_query_tokens is not None and b.base_load is None:
            b.base_load = snap
        if b.base_load is not None:
            rate = engine_hit_rate(b.base_load, snap)
            if rate is not None:
                b.engine_hit_rate = rate
        elif snap.cache_hit_rate is not None:
            b.engine_hit_rate = snap.cache_hit_rate
        if snap.kv_capacity_tokens:
            self.on_capacity(b.url, snap.kv_capacity_tokens)
        self.on_scrape(b, "ok", reading.problems)

    async def _complete_llamacpp(self, b: Backend, snap):  # type: ignore[no-untyped-def]
        timeout = self.pool.scrape.timeout_s
        slots_body = await self._get_body(b.url + "/slots", timeout)
        slots = parse_slots(slots_body)[0] if slots_body is not None else None
        props = None
        if not b.templates_from_props:
            props_body = await self._get_body(b.url + "/props", timeout)
            props = parse_props(props_body)[0] if props_body is not None else None
            if props is not None and props.chat_template and b.models:
                for model in b.models:
                    self.on_template(
                        model, props.chat_template, props.bos_token or "", props.eos_token or ""
                    )
                b.templates_from_props = True
        return with_slot_load(snap, props, slots)

    def _scrape_failed(self, b: Backend, kind: str, problems: tuple[str, ...] = ()) -> None:
        if b.last_scrape_ok:
            log.warning(
                "backend %s: metrics scrape failed (%s %s); routing on local counts",
                b.url,
                kind,
                ",".join(problems),
            )
        b.last_scrape_ok = False
        b.scrape_problems = problems
        self.on_scrape(b, kind, problems)

    async def _get_ok(self, url: str, timeout: float) -> bool:
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                await r.read()
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _get_body(self, url: str, timeout: float) -> bytes | None:
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                if r.status != 200:
                    return None
                body = await r.content.read(MAX_METRICS_BYTES + 1)
                return body if len(body) <= MAX_METRICS_BYTES else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
