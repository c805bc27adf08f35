"""Cluster sync: share prefix ownership between proxy replicas (and workers) through Redis.

Every proxy keeps its own ``PrefixIndex`` and routes from it alone; Redis is never on the
request path. What one proxy learns (backend B now holds block chain H) is queued by
``publish`` in O(1), flushed in batches to one Redis stream, and applied by every other
proxy to its own index, so N proxies route as one would.

Why a stream (XADD with ``MAXLEN ~``, XREAD BLOCK from the last id seen) and not pub/sub:
a proxy that loses Redis for a few seconds resumes from its position and misses nothing;
pub/sub drops whatever was sent while it was away. Only if the stream was trimmed past that
position (or on first start) does a proxy fall back to snapshots: every node writes, per
backend, its ``snapshot_blocks`` most recent hashes to a Redis hash with a TTL, and a node
that starts or lost updates merges all of them into its index.

Peer updates are applied for any backend URL, also ones this proxy does not route to yet
(a peer's discovery may be ahead, and the index is warm when this proxy catches up). Memory
stays bounded: each backend's LRU is capped by its capacity, and at most ``MAX_BACKENDS``
distinct backends are taken in; updates for more are counted ``rejected``.

Optionally (``share_inflight``) each node piggybacks its per-backend in-flight counts on its
batches (at least every ``INFLIGHT_HEARTBEAT_S``), and ``remote_inflight`` sums the other
nodes' fresh counts. Fresher than scraped engine metrics, which already give a global but
lagging view, at the price of clock-sync sensitivity (counts older than
``INFLIGHT_TTL_S`` by the receiver's clock are ignored) and more stream traffic.

Redis down or slow: requests keep being served from local state, ``publish`` keeps queueing
(the oldest updates are dropped and counted once the buffer is full), the node reconnects
with exponential back-off, and one log line marks each change between up and down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from proxy.cluster.codec import (
    MAX_NAME_CHARS,
    Batch,
    CodecError,
    Update,
    decode_batch,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
)
from proxy.cluster.merge import merge_recent
from proxy.config import ClusterConfig
from proxy.routing.index import PrefixIndex
from proxy.telemetry.metrics import ProxyMetrics

log = logging.getLogger("prefix_proxy.cluster")

STREAM_MAXLEN = 2000  # batches kept; at 20 batches/s per node, minutes of one node's updates
BUFFER_BATCHES = 8  # the publish buffer holds this many full batches
READ_BLOCK_MS = 500
READ_COUNT = 32
COMMAND_TIMEOUT_S = 2.0  # a Redis slower than this counts as down
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
STOP_TIMEOUT_S = COMMAND_TIMEOUT_S + READ_BLOCK_MS / 1000 + 0.5
INFLIGHT_HEARTBEAT_S = 1.0
INFLIGHT_TTL_S = 3.0
MAX_BACKENDS = 4096
MAX_PEERS = 1024
APPLY_CHUNK = 8192  # hashes inserted between yields to the event loop during bootstrap
EVENTS = ("sent", "received", "dropped", "invalid", "rejected")


def default_node_id() -> str:
    """Unique per process, so each ``--workers`` process is a node of its own."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class ClusterSync:
    """Publishes local prefix ownership to peers and applies theirs to the local index.

    ``clock`` must be wall-clock time (not monotonic): update times are compared across
    hosts for the lag gauge and in-flight freshness. ``inflight`` returns this node's own
    per-backend in-flight counts; it is read only when ``cfg.share_inflight`` is on.
    """

    def __init__(
        self,
        cfg: ClusterConfig,
        index: PrefixIndex,
        metrics: ProxyMetrics,
        node_id: str,
        clock: Callable[[], float] = time.time,
        inflight: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.index = index
        self.node_id = node_id
        self.enabled = cfg.redis_url is not None
        self._clock = clock
        self._inflight_source = inflight if cfg.share_inflight else None
        prefix = cfg.key_prefix
        self._stream = f"{prefix}:ownership".encode()
        self._snapshot_key = f"{prefix}:snapshot:{node_id}".encode()
        self._snapshot_match = _glob_escape(prefix) + ":snapshot:*"
        self._where = _redact(cfg.redis_url or "")
        self._max_batch = max(1, cfg.max_batch)
        self._flush_s = max(0.001, cfg.flush_interval_s)
        self._buffer: deque[tuple[str, Sequence[int], float]] = deque(
            maxlen=self._max_batch * BUFFER_BATCHES
        )
        self._full = asyncio.Event()
        self._up_gauge = metrics.cluster_up
        self._lag_gauge = metrics.cluster_lag
        self._events = {k: metrics.cluster_events.labels(k) for k in EVENTS}
        self._counts = dict.fromkeys(EVENTS, 0)
        self._client: aioredis.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._state = "stopped"
        self._since = clock()
        self._last_error: str | None = None
        self._position: bytes | None = None
        self._lag: float | None = None
        self._snapshot_at: float | None = None
        self._peers: dict[str, float] = {}
        self._sent_inflight: dict[str, int] | None = None
        self._sent_inflight_at = -math.inf
        self._peer_inflight: dict[str, tuple[float, dict[str, int]]] = {}
        self._remote_totals: dict[str, int] = {}
        self._totals_valid_until = math.inf

    # Lifecycle

    async def start(self) -> None:
        """Connects in the background: never waits for Redis, never raises."""
        if not self.enabled or self._task is not None or self._stopping.is_set():
            return
        try:
            self._client = aioredis.from_url(
                self.cfg.redis_url or "",
                socket_timeout=COMMAND_TIMEOUT_S + READ_BLOCK_MS / 1000,
                socket_connect_timeout=COMMAND_TIMEOUT_S,
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as e:
            self._went_down(e)
            return
        self._set_state("connecting")
        self._task = asyncio.create_task(self._supervise(), name="cluster-sync")

    async def stop(self) -> None:
        """Best effort: flush what is queued and withdraw in-flight counts, then close.

        The loops also watch a stop flag, because cancellation alone is not reliable:
        redis-py 8.1 on Python 3.11 now and then swallows a task's cancellation inside a
        command (seen in MULTI/EXEC pipelines), which would leave a loop running forever.
        """
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            done, _ = await asyncio.wait([self._task], timeout=STOP_TIMEOUT_S)
            if not done:
                log.warning("cluster sync did not stop within %.1f s", STOP_TIMEOUT_S)
            self._task = None
        if self._client is None:
            return
        if self._state == "up":
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(COMMAND_TIMEOUT_S):
                    for _ in range(BUFFER_BATCHES + 1):
                        await self._flush(self._client, farewell=True)
                        if not self._buffer:
                            break
        with contextlib.suppress(RedisError, OSError):
            await self._client.aclose()
        self._client = None
        self._set_state("stopped")
        self._up_gauge.set(0)

    # Request path: no I/O, never raises

    def publish(self, backend: str, hashes: Sequence[int]) -> None:
        """Queue ``backend`` took ``hashes`` for peers. Do not mutate ``hashes`` afterwards."""
        if not self.enabled or not hashes or self._stopping.is_set():
            return
        buf = self._buffer
        if len(buf) == buf.maxlen:
            self._count("dropped")
        buf.append((backend, hashes, self._clock()))  # a plain tuple: cheapest to build
        if len(buf) >= self._max_batch:
            self._full.set()

    def remote_inflight(self, backend: str) -> int:
        """Requests the other nodes have outstanding on ``backend`` (0 when not sharing)."""
        if not self._peer_inflight:
            return 0
        now = self._clock()
        if now >= self._totals_valid_until:
            self._sum_inflight(now)
        return self._remote_totals.get(backend, 0)

    def status(self) -> dict[str, Any]:
        """For the admin API and UI."""
        now = self._clock()
        return {
            "enabled": self.enabled,
            "node_id": self.node_id,
            "redis": self._where,
            "state": self._state,
            "up": self._state == "up",
            "since_s": round(max(0.0, now - self._since), 3),
            "last_error": self._last_error,
            "lag_s": None if self._lag is None else round(self._lag, 4),
            "buffered": len(self._buffer),
            "buffer_limit": self._buffer.maxlen,
            "events": dict(self._counts),
            "peers": {n: round(max(0.0, now - t), 3) for n, t in self._peers.items()},
            "snapshot_age_s": (
                None if self._snapshot_at is None else round(max(0.0, now - self._snapshot_at), 3)
            ),
            "share_inflight": self._inflight_source is not None,
        }

    # Connection supervision

    async def _supervise(self) -> None:
        assert self._client is not None
        delay = BACKOFF_MIN_S
        while not self._stopping.is_set():
            try:
                await self._session(self._client)
            except Exception as e:  # any failure: serve locally, reconnect later
                if self._state == "up":
                    delay = BACKOFF_MIN_S
                self._went_down(e)
                with contextlib.suppress(RedisError, OSError):
                    await self._client.connection_pool.disconnect()  # drop stale connections
            await self._pause(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake up at once when ``stop`` is called."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _session(self, r: aioredis.Redis) -> None:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            await r.ping()
        await self._catch_up(r)
        self._went_up()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._read_loop(r))
            tg.create_task(self._flush_loop(r))
            tg.create_task(self._snapshot_loop(r))

    def _went_up(self) -> None:
        self._last_error = None
        self._up_gauge.set(1)
        if self._state != "up":
            log.info("cluster sync up: %s, node %s", self._where, self.node_id)
            self._set_state("up")

    def _went_down(self, e: BaseException) -> None:
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        self._last_error = f"{type(e).__name__}: {e}"
        self._up_gauge.set(0)
        if self._state == "down":
            return
        expected = isinstance(e, RedisError | OSError | TimeoutError | ValueError)
        log.warning(
            "cluster sync down: %s: %s; routing from the local index, reconnecting",
            self._where,
            self._last_error,
            exc_info=None if expected else e,
        )
        self._set_state("down")

    def _set_state(self, state: str) -> None:
        self._state = state
        self._since = self._clock()

    # Catching up: stream position and snapshots

    async def _catch_up(self, r: aioredis.Redis) -> None:
        """Pick the stream position to read from; load snapshots unless nothing was missed.

        Nothing was missed exactly when the last entry read is still in the stream: ``MAXLEN
        ~`` trims whole entries oldest first, so everything after it is still there too.
        """
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            last = await r.xrevrange(self._stream, count=1)
            here = self._position
            if here is not None and await r.xrange(self._stream, min=here, max=here, count=1):
                return
        if here is None:  # first start: snapshots, then what arrives after them
            self._position = last[0][0] if last else b"0-0"
        elif not last or _entry_id(last[0][0]) < _entry_id(here):  # a new stream (restart)
            self._position = b"0-0"
        await self._load_snapshots(r)

    async def _load_snapshots(self, r: aioredis.Redis) -> None:
        keys: list[bytes] = []
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            async for key in r.scan_iter(match=self._snapshot_match, count=256):
                if key != self._snapshot_key and len(keys) < MAX_PEERS:
                    keys.append(key)
        per_backend: dict[str, list[tuple[float, Sequence[int]]]] = {}
        for key in keys:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                fields = await r.hgetall(key)
            for name, value in fields.items():
                try:
                    backend = name.decode()
                    ts, hashes = decode_snapshot(value)
                except (UnicodeDecodeError, CodecError):
                    self._count("invalid")
                    continue
                if backend and len(backend) <= MAX_NAME_CHARS:
                    per_backend.setdefault(backend, []).append((ts, hashes))
                else:
                    self._count("invalid")
        known = set(self.index.backends())
        for backend, snaps in per_backend.items():
            if not self._admit(backend, known):
                continue
            snaps.sort(key=lambda s: s[0], reverse=True)
            merged = merge_recent([h for _, h in snaps], self.index.capacity(backend))
            await self._insert_oldest_first(backend, merged)

    async def _insert_oldest_first(self, backend: str, hashes: list[int]) -> None:
        """Insert so the newest ends up most recent, yielding to requests between chunks."""
        for start in range(0, len(hashes), APPLY_CHUNK):
            chunk = hashes[start : start + APPLY_CHUNK]
            self.index.insert(backend, chunk[::-1])
            await asyncio.sleep(0)

    async def _snapshot_loop(self, r: aioredis.Redis) -> None:
        while not self._stopping.is_set():
            await self._write_snapshot(r)
            await self._pause(max(0.1, self.cfg.snapshot_interval_s))

    async def _write_snapshot(self, r: aioredis.Redis) -> None:
        now = self._clock()
        mapping: dict[str, bytes] = {}
        for backend in self.index.backends():
            hashes = self.index.recent(backend, max(1, self.cfg.snapshot_blocks))
            if not hashes:
                continue
            try:
                mapping[backend] = encode_snapshot(now, hashes)
            except (OverflowError, TypeError):
                self._count("invalid")
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            async with r.pipeline(transaction=True) as p:
                p.delete(self._snapshot_key)
                if mapping:
                    p.hset(self._snapshot_key, mapping=mapping)
                    p.pexpire(self._snapshot_key, max(1, int(self.cfg.snapshot_ttl_s * 1000)))
                await p.execute()
        self._snapshot_at = now

    # Receiving

    async def _read_loop(self, r: aioredis.Redis) -> None:
        while not self._stopping.is_set():
            assert self._position is not None
            reply = await r.xread(
                {self._stream: self._position}, count=READ_COUNT, block=READ_BLOCK_MS
            )
            if not reply:
                continue
            known = set(self.index.backends())
            for _stream, entries in reply:
                for entry_id, fields in entries:
                    self._position = entry_id
                    self._apply(fields, known)
                    await asyncio.sleep(0)

    def _apply(self, fields: Mapping[bytes, bytes], known: set[str]) -> None:
        try:
            batch = decode_batch(fields)
        except CodecError:
            self._count("invalid")
            return
        if batch.node == self.node_id:
            return
        now = self._clock()
        self._seen_peer(batch.node, now)
        if batch.inflight is not None:
            self._set_peer_inflight(batch, now)
        applied = 0
        newest = -math.inf
        for u in batch.updates:
            if self._admit(u.backend, known):
                self.index.insert(u.backend, u.hashes)
                applied += 1
                newest = max(newest, u.ts)
        if applied:
            self._count("received", applied)
            self._lag = max(0.0, now - newest)
            self._lag_gauge.set(self._lag)

    def _admit(self, backend: str, known: set[str]) -> bool:
        if backend in known:
            return True
        if len(known) >= MAX_BACKENDS:
            self._count("rejected")
            return False
        known.add(backend)
        return True

    def _seen_peer(self, node: str, now: float) -> None:
        self._peers.pop(node, None)
        self._peers[node] = now
        if len(self._peers) > MAX_PEERS:
            del self._peers[next(iter(self._peers))]

    def _set_peer_inflight(self, batch: Batch, now: float) -> None:
        if batch.sent_at < now - INFLIGHT_TTL_S:  # replayed from the stream: stale
            return
        if batch.inflight:
            self._peer_inflight[batch.node] = (now + INFLIGHT_TTL_S, batch.inflight)
        else:
            self._peer_inflight.pop(batch.node, None)
        self._totals_valid_until = -math.inf

    def _sum_inflight(self, now: float) -> None:
        for node in [n for n, (exp, _) in self._peer_inflight.items() if exp <= now]:
            del self._peer_inflight[node]
        totals: dict[str, int] = {}
        for _, counts in self._peer_inflight.values():
            for backend, n in counts.items():
                totals[backend] = totals.get(backend, 0) + n
        self._remote_totals = totals
        self._totals_valid_until = min(
            (exp for exp, _ in self._peer_inflight.values()), default=math.inf
        )

    # Sending

    async def _flush_loop(self, r: aioredis.Redis) -> None:
        while not self._stopping.is_set():
            if len(self._buffer) < self._max_batch:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._flush_s):
                        await self._full.wait()
            self._full.clear()
            await self._flush(r)

    async def _flush(self, r: aioredis.Redis, farewell: bool = False) -> None:
        """Send one batch of up to ``max_batch`` updates (and in-flight counts when due)."""
        now = self._clock()
        inflight = self._inflight_due(now, farewell)
        if not self._buffer and inflight is None:
            return
        n = min(len(self._buffer), self._max_batch)
        updates = [Update(*self._buffer.popleft()) for _ in range(n)]
        fields, skipped = encode_batch(Batch(self.node_id, now, updates, inflight))
        if skipped:
            self._count("invalid", skipped)
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                await r.xadd(self._stream, fields, maxlen=STREAM_MAXLEN, approximate=True)
        except BaseException:
            self._count("dropped", n - skipped)
            raise
        if n - skipped:
            self._count("sent", n - skipped)
        if inflight is not None:
            self._sent_inflight, self._sent_inflight_at = inflight, now

    def _inflight_due(self, now: float, farewell: bool) -> dict[str, int] | None:
        if self._inflight_source is None:
            return None
        if farewell:
            return {}
        counts = {b: int(n) for b, n in self._inflight_source().items() if n > 0}
        if counts != self._sent_inflight or now - self._sent_inflight_at >= INFLIGHT_HEARTBEAT_S:
            return counts
        return None

    def _count(self, kind: str, n: int = 1) -> None:
        self._counts[kind] += n
        self._events[kind].inc(n)


def _entry_id(raw: bytes | str) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _redact(url: str) -> str:
    """The Redis URL without its password, for logs and status."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        user = f"{parts.username}:***@" if parts.username else ":***@"
        return urlunsplit(parts._replace(netloc=user + host))
    except ValueError:
        return "<unparseable redis url>"
