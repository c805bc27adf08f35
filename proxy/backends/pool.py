"""The backend pool: live state per backend, and the views routing reads.

State changes come from three places only: the request path (in-flight counts, passive
failures), the background monitor (health, models, scraped load), and the admin API or
discovery (add, drain, remove). Routing never sees this mutable state, only the frozen
``BackendView`` pictures ``views`` hands out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from proxy.backends.load import LoadSnapshot
from proxy.config import HealthConfig, ScrapeConfig
from proxy.routing.views import BackendView

log = logging.getLogger("prefix_proxy.backends")


@dataclass(slots=True)
class Backend:
    """Mutable state of one engine replica."""

    url: str
    models: frozenset[str] = frozenset()
    healthy: bool = True
    draining: bool = False
    inflight: int = 0
    inflight_at_scrape: int = 0
    load: LoadSnapshot | None = None
    prev_load: LoadSnapshot | None = None
    last_scrape_ok: bool = False
    scrape_problems: tuple[str, ...] = ()
    dialect: str | None = None
    engine_hit_rate: float | None = None
    consecutive_failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    base_load: LoadSnapshot | None = None
    requests: int = 0
    predicted_hit_tokens: float = 0.0
    predicted_prompt_tokens: float = 0.0
    added_at: float = 0.0
    templates_from_props: bool = False

    @property
    def circuit_open(self) -> bool:
        return self.ejected_until > 0.0

    def load_stale(self, now: float, stale_after_s: float) -> bool:
        """Scraped load is not trusted: never scraped, last scrape failed, or too old."""
        return (
            self.load is None
            or not self.last_scrape_ok
            or now - self.load.scraped_at > stale_after_s
        )

    def predicted_hit_rate(self) -> float | None:
        """Share of prompt tokens the index expected this backend to hold, since it joined."""
        if self.predicted_prompt_tokens <= 0:
            return None
        return min(1.0, self.predicted_hit_tokens / self.predicted_prompt_tokens)


class BackendPool:
    def __init__(self, health: HealthConfig, scrape: ScrapeConfig) -> None:
        self.health = health
        self.scrape = scrape
        self._backends: dict[str, Backend] = {}

    def __contains__(self, url: str) -> bool:
        return url in self._backends

    def __iter__(self):
        return iter(list(self._backends.values()))

    def __len__(self) -> int:
        return len(self._backends)

    def get(self, url: str) -> Backend | None:
        return self._backends.get(url)

    def add(self, url: str, now: float) -> Backend:
        """Add a backend (cold: routing learns its cache as traffic arrives)."""
        url = url.rstrip("/")
        backend = self._backends.get(url)
        if backend is None:
            backend = self._backends[url] = Backend(url=url, added_at=now)
            log.info("backend added: %s", url)
        backend.draining = False
        return backend

    def drain(self, url: str) -> bool:
        backend = self._backends.get(url.rstrip("/"))
        if backend is None:
            return False
        backend.draining = True
        log.info("backend draining: %s (%d in flight)", backend.url, backend.inflight)
        return True

    def remove(self, url: str) -> Backend | None:
        backend = self._backends.pop(url.rstrip("/"), None)
        if backend is not None:
            log.info("backend removed: %s", backend.url)
        return backend

    def set_targets(self, urls: Iterable[str], now: float) -> list[str]:
        """Follow discovery: add new URLs, drain the ones that left. Returns drained URLs."""
        wanted = {u.rstrip("/") for u in urls}
        for url in wanted:
            self.add(url, now)
        gone = [b.url for b in self._backends.values() if b.url not in wanted]
        for url in gone:
            self.drain(url)
        return gone

    def drained_idle(self) -> list[str]:
        """Draining backends with nothing in flight: safe to remove."""
        return [b.url for b in self._backends.values() if b.draining and b.inflight == 0]

    def views(
        self, now: float, remote_inflight: Callable[[str], int] | None = None
    ) -> list[BackendView]:
        """Frozen pictures for routing; ``remote_inflight`` adds other proxies' counts."""
        stale_after = self.scrape.stale_after_s
        return [
            BackendView(
                id=b.url,
                healthy=b.healthy,
                draining=b.draining,
                circuit_open=b.circuit_open,
                models=b.models,
                inflight=b.inflight + (remote_inflight(b.url) if remote_inflight else 0),
                load=b.load,
                load_stale=b.load_stale(now, stale_after),
                inflight_at_scrape=b.inflight_at_scrape,
            )
            for b in self._backends.values()
        ]

    def healthy_count(self) -> int:
        return sum(1 for b in self._backends.values() if b.healthy and not b.circuit_open)

    # Passive health: the request path reports each attempt's outcome.

    def record_success(self, backend: Backend) -> None:
        backend.consecutive_failures = 0
        if backend.circuit_open:
            backend.ejected_until = 0.0
            backend.ejections = 0
            log.info("backend recovered: %s", backend.url)

    def record_failure(self, backend: Backend, now: float) -> bool:
        """Count a connect error or 5xx; returns True when this failure ejects the backend."""
        backend.consecutive_failures += 1
        if backend.consecutive_failures < self.health.eject_after_failures:
            return False
        if backend.circuit_open and now < backend.ejected_until:
            return False
        backend.ejections += 1
        backoff = min(
            self.health.backoff_max_s,
            self.health.backoff_base_s * 2 ** (backend.ejections - 1),
        )
        backend.ejected_until = now + backoff
        log.warning(
            "backend ejected: %s after %d consecutive failures, probe in %.1fs",
            backend.url,
            backend.consecutive_failures,
            backoff,
        )
        return True

    def due_for_probe(self, backend: Backend, now: float) -> bool:
        """Half-open: an ejected backend whose back-off has passed gets one probe."""
        return backend.circuit_open and now >= backend.ejected_until
