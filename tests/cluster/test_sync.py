"""ClusterSync against real redis-server processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest_asyncio

from proxy.cluster.codec import Batch, Update, encode_batch
from proxy.cluster.sync import BUFFER_BATCHES, MAX_BACKENDS, ClusterSync
from proxy.config import ClusterConfig
from proxy.routing.index import PrefixIndex
from proxy.telemetry.metrics import ProxyMetrics
from tests.cluster.conftest import free_port

B1 = "http://10.0.0.1:8000"
B2 = "http://10.0.0.2:8000"


@dataclass
class Node:
    sync: ClusterSync
    index: PrefixIndex
    metrics: ProxyMetrics
    inflight: dict[str, int] = field(default_factory=dict)

    def gauge(self, name: str) -> float | None:
        return self.metrics.registry.get_sample_value(name)

    def events(self, direction: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "prefix_proxy_cluster_sync_events_total", {"direction": direction}
        )
        return value or 0.0


@pytest_asyncio.fixture
async def make_node() -> AsyncIterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def make(url: str | None, name: str, capacity: int = 10_000, **cfg: object) -> Node:
        settings: dict[str, object] = {"flush_interval_s": 0.01, "snapshot_interval_s": 0.2}
        settings.update(cfg)
        index = PrefixIndex(capacity)
        metrics = ProxyMetrics()
        node = Node(None, index, metrics)  # type: ignore[arg-type]
        node.sync = ClusterSync(
            ClusterConfig(redis_url=url, key_prefix="test", **settings),  # type: ignore[arg-type]
            index,
            metrics,
            node_id=name,
            inflight=lambda: node.inflight,
        )
        nodes.append(node)
        return node

    yield make
    for n in nodes:
        await n.sync.stop()


async def eventually(check: Callable[[], bool], what: str, tries: int = 200) -> None:
    """Polls ``check`` up to ``tries`` times, 25 ms apart."""
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never happened: {what}")


async def test_two_nodes_exchange_updates(redis_server, make_node) -> None:
    server = redis_server()
    a, b = make_node(server.url, "a"), make_node(server.url, "b")
    await a.sync.start()
    await b.sync.start()
    await eventually(lambda: a.sync.status()["up"] and b.sync.status()["up"], "both up")

    a.sync.publish(B1, [11, 12, 13])
    b.sync.publish(B2, [21, 22])
    await eventually(lambda: b.index.match(B1, [11, 12, 13, 14]) == 3, "b learns a's update")
    await eventually(lambda: a.index.match(B2, [21, 22]) == 2, "a learns b's update")

    assert a.index.size(B1) == 0, "a node must not apply its own updates"
    assert b.index.size(B2) == 0
    assert a.events("sent") == 1 and a.events("received") == 1
    assert set(b.sync.status()["peers"]) == {"a"}
    assert a.gauge("prefix_proxy_cluster_sync_up") == 1
    assert a.gauge("prefix_proxy_cluster_sync_lag_seconds") >= 0


async def test_new_node_bootstraps_from_snapshots(redis_server, make_node) -> None:
    server = redis_server()
    a = make_node(server.url, "a")
    old, new = list(range(1, 101)), list(range(1001, 1101))
    a.index.insert(B1, old)
    a.index.insert(B1, new)
    await a.sync.start()
    await eventually(lambda: a.sync.status()["snapshot_age_s"] is not None, "a wrote a snapshot")

    late = make_node(server.url, "late", capacity=100)
    await late.sync.start()
    await eventually(lambda: late.index.size(B1) == 100, "late node filled from a's snapshot")
    assert late.index.match(B1, new) == 100, "the newest blocks survive the capacity limit"
    assert late.index.match(B1, old) == 0
    # Recency order survives the trip: more inserts evict exactly what a's index would.
    reference = PrefixIndex(100)
    for chain in (old, new, [5000 + i for i in range(10)]):
        reference.insert(B1, chain)
    late.index.insert(B1, [5000 + i for i in range(10)])
    assert late.index.recent(B1, 100) == reference.recent(B1, 100)


async def test_password_auth(redis_server, make_node) -> None:
    server = redis_server("--requirepass", "s3cret pass")
    good_url = server.url.replace("s3cret pass", "s3cret%20pass")
    a, b = make_node(good_url, "a"), make_node(good_url, "b")
    wrong = make_node(f"redis://:nope@127.0.0.1:{server.port}/0", "wrong")
    for n in (a, b, wrong):
        await n.sync.start()
    await eventually(lambda: a.sync.status()["up"] and b.sync.status()["up"], "auth works")
    a.sync.publish(B1, [1, 2])
    await eventually(lambda: b.index.match(B1, [1, 2]) == 2, "update over an authed link")

    await eventually(lambda: wrong.sync.status()["last_error"] is not None, "wrong password")
    status = wrong.sync.status()
    assert not status["up"]
    assert "nope" not in status["redis"] and "***" in status["redis"]
    assert "s3cret" not in a.sync.status()["redis"]
    wrong.sync.publish(B1, [3])  # still accepted locally, nothing raises
    assert wrong.sync.status()["buffered"] == 1


async def test_redis_dies_and_comes_back(redis_server, make_node, caplog) -> None:
    caplog.set_level(logging.INFO, logger="prefix_proxy.cluster")
    server = redis_server()
    a, b = make_node(server.url, "a"), make_node(server.url, "b")
    await a.sync.start()
    await b.sync.start()
    await eventually(lambda: a.sync.status()["up"] and b.sync.status()["up"], "both up")
    a.sync.publish(B1, [1])
    await eventually(lambda: b.index.match(B1, [1]) == 1, "first update")
    caplog.clear()

    server.kill()
    for i in range(200):  # publishing never raises while Redis is gone
        a.sync.publish(B1, [100 + i])
        if i % 20 == 0:
            await asyncio.sleep(0.02)
    await eventually(lambda: a.gauge("prefix_proxy_cluster_sync_up") == 0, "a's gauge drops")
    await eventually(lambda: not b.sync.status()["up"], "b notices")
    await asyncio.sleep(0.5)  # several reconnect attempts fail meanwhile
    down_lines = [r for r in caplog.records if r.name == "prefix_proxy.cluster"]
    assert sum("down" in r.getMessage() for r in down_lines) == 2, "one line per node"
    assert all(r.levelno == logging.WARNING for r in down_lines)
    caplog.clear()

    server.start()
    await eventually(lambda: a.gauge("prefix_proxy_cluster_sync_up") == 1, "a reconnects")
    await eventually(lambda: b.sync.status()["up"], "b reconnects")
    up_lines = [r for r in caplog.records if r.name == "prefix_proxy.cluster"]
    assert sum("up" in r.getMessage() for r in up_lines) == 2, "one line per node"
    await eventually(lambda: b.index.match(B1, [299]) == 1, "updates queued while down arrive")
    a.sync.publish(B2, [7, 8])
    await eventually(lambda: b.index.match(B2, [7, 8]) == 2, "live updates flow again")


async def test_short_disconnect_resumes_from_the_stream(redis_server, relay, make_node) -> None:
    server = redis_server()
    link = await relay(server.port)
    a = make_node(server.url, "a", snapshot_interval_s=60.0)
    b = make_node(link.url(), "b")
    await a.sync.start()
    await b.sync.start()
    await eventually(lambda: a.sync.status()["up"] and b.sync.status()["up"], "both up")
    a.sync.publish(B1, [1])
    await eventually(lambda: b.index.match(B1, [1]) == 1, "first update")

    await link.cut()
    await eventually(lambda: not b.sync.status()["up"], "b lost redis")
    a.sync.publish(B1, [2, 3])  # a's snapshot is older than this: only the stream has it
    await eventually(lambda: a.events("sent") == 2, "a sent while b was away")
    await link.open()
    await eventually(lambda: b.index.match(B1, [2, 3]) == 2, "b reads what it missed")
    assert b.sync.status()["up"]


async def test_trimmed_past_position_reloads_snapshots(redis_server, relay, make_node) -> None:
    server = redis_server()
    link = await relay(server.port)
    a = make_node(server.url, "a")
    b = make_node(link.url(), "b")
    await a.sync.start()
    await b.sync.start()
    await eventually(lambda: a.sync.status()["up"] and b.sync.status()["up"], "both up")
    a.sync.publish(B1, [1])
    await eventually(lambda: b.index.match(B1, [1]) == 1, "b has read an entry")

    await link.cut()
    await eventually(lambda: not b.sync.status()["up"], "b lost redis")
    a.index.insert(B1, [7, 8, 9])  # what the app does on commit, next to publish
    a.sync.publish(B1, [7, 8, 9])
    await eventually(lambda: a.events("sent") == 2, "a sent while b was away")
    raw = server.client()
    raw.xtrim("test:ownership", maxlen=0, approximate=False)  # the stream moved on without b
    raw.close()
    snapshot_before = a.sync.status()["snapshot_age_s"]
    await eventually(
        lambda: a.sync.status()["snapshot_age_s"] < snapshot_before, "a wrote a new snapshot"
    )
    await link.open()
    await eventually(lambda: b.index.match(B1, [7, 8, 9]) == 3, "b recovers from snapshots")


async def test_frozen_redis_counts_as_down(redis_server, make_node) -> None:
    server = redis_server()
    a = make_node(server.url, "a")
    await a.sync.start()
    await eventually(lambda: a.sync.status()["up"], "a up")
    server.pause()
    try:
        a.sync.publish(B1, [1])
        await eventually(lambda: a.sync.status()["state"] == "down", "timeout noticed", 400)
        assert "Timeout" in a.sync.status()["last_error"]
        a.sync.publish(B1, [2])
    finally:
        server.resume()
    await eventually(lambda: a.sync.status()["up"], "a back up once redis answers", 400)


async def test_tls_with_password(redis_server, make_node) -> None:
    server = redis_server("--requirepass", "pw", tls=True)
    a, b = make_node(server.url, "a"), make_node(server.url, "b")
    await a.sync.start()
    await b.sync.start()
    await eventually(lambda: a.sync.status()["up"] and b.sync.status()["up"], "both up")
    assert a.sync.status()["redis"].startswith("rediss://:***@")
    a.sync.publish(B1, [5, 6])
    await eventually(lambda: b.index.match(B1, [5, 6]) == 2, "update over TLS")


async def test_full_buffer_drops_oldest_and_counts(make_node) -> None:
    a = make_node(f"redis://127.0.0.1:{free_port()}/0", "a", max_batch=4)
    await a.sync.start()
    limit = 4 * BUFFER_BATCHES
    for i in range(limit + 10):
        a.sync.publish(B1, [i])
    status = a.sync.status()
    assert status["buffer_limit"] == limit
    assert status["buffered"] == limit
    assert status["events"]["dropped"] == 10
    assert a.events("dropped") == 10
    await eventually(lambda: a.sync.status()["state"] == "down", "unreachable redis is down")
    assert a.gauge("prefix_proxy_cluster_sync_up") == 0


async def test_start_never_waits_for_redis(make_node) -> None:
    blackhole = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = blackhole.sockets[0].getsockname()[1]
    try:
        a = make_node(f"redis://127.0.0.1:{port}/0", "a")
        await a.sync.start()  # the server accepts and never answers
        assert a.sync.status()["state"] == "connecting"
        a.sync.publish(B1, [1])
        assert a.sync.status()["buffered"] == 1
    finally:
        blackhole.close()


async def test_garbage_in_the_stream_is_counted_and_skipped(redis_server, make_node) -> None:
    server = redis_server()
    b = make_node(server.url, "b")
    await b.sync.start()
    await eventually(lambda: b.sync.status()["up"], "b up")
    raw = server.client()
    raw.xadd("test:ownership", {"m": b"{not json"})
    raw.xadd("test:ownership", {"x": b"1"})
    fields, _ = encode_batch(Batch("evil", 1.0, [Update(B1, [1], 1.0)]))
    raw.xadd("test:ownership", {"m": fields[b"m"], "h": b"short"})
    good, _ = encode_batch(Batch("peer", 1.0, [Update(B1, [42, 43], 1.0)]))
    raw.xadd("test:ownership", good)
    raw.hset("test:snapshot:bad", mapping={"http://x": b"abc", b"\xff": b"12345678"})
    raw.close()
    await eventually(lambda: b.index.match(B1, [42, 43]) == 2, "the good entry still applies")
    assert b.events("invalid") == 3
    assert b.sync.status()["up"]


async def test_backends_taken_from_peers_are_bounded(redis_server, make_node) -> None:
    server = redis_server()
    b = make_node(server.url, "b", capacity=4)
    await b.sync.start()
    await eventually(lambda: b.sync.status()["up"], "b up")
    flood = [Update(f"http://h{i}", [i], 1.0) for i in range(MAX_BACKENDS + 5)]
    fields, _ = encode_batch(Batch("peer", 1.0, flood))
    raw = server.client()
    raw.xadd("test:ownership", fields)
    raw.close()
    await eventually(lambda: b.events("received") == MAX_BACKENDS, "the first ones apply")
    assert len(b.index.backends()) == MAX_BACKENDS
    assert b.events("rejected") == 5


async def test_inflight_counts_are_shared(redis_server, make_node) -> None:
    server = redis_server()
    a = make_node(server.url, "a", share_inflight=True)
    b = make_node(server.url, "b", share_inflight=True)
    c = make_node(server.url, "c", share_inflight=True)
    for n in (a, b, c):
        await n.sync.start()
    a.inflight.update({B1: 3, B2: 0})
    b.inflight.update({B1: 2})
    await eventually(lambda: c.sync.remote_inflight(B1) == 5, "c sees a + b")
    assert c.sync.remote_inflight(B2) == 0
    await eventually(lambda: a.sync.remote_inflight(B1) == 2, "a counts only the others")
    a.inflight[B1] = 1
    await eventually(lambda: c.sync.remote_inflight(B1) == 3, "changes propagate")
    await a.sync.stop()
    await eventually(lambda: c.sync.remote_inflight(B1) == 2, "a stopping withdraws its counts")


async def test_inflight_sharing_off_by_default(redis_server, make_node) -> None:
    server = redis_server()
    a, b = make_node(server.url, "a"), make_node(server.url, "b")
    a.inflight[B1] = 4
    await a.sync.start()
    await b.sync.start()
    a.sync.publish(B1, [1])
    await eventually(lambda: b.index.match(B1, [1]) == 1, "b hears from a")
    assert b.sync.remote_inflight(B1) == 0


async def test_stop_always_ends_the_background_work(redis_server, make_node) -> None:
    """Stopping right as snapshots are written: cancellation alone once hung here (redis-py
    can swallow a cancel inside MULTI/EXEC), so stop must not depend on it."""
    server = redis_server()
    for i in range(60):
        node = make_node(server.url, f"n{i}", snapshot_interval_s=0.001, flush_interval_s=0.001)
        node.index.insert(B1, [1, 2, 3])
        await node.sync.start()
        await eventually(lambda n=node: n.sync.status()["up"], "up")
        task = node.sync._task
        await asyncio.wait_for(node.sync.stop(), 10)
        assert task is not None and task.done()
        assert node.sync.status()["state"] == "stopped"


async def test_disabled_without_redis_url(make_node) -> None:
    a = make_node(None, "a")
    await a.sync.start()
    a.sync.publish(B1, [1])
    status = a.sync.status()
    assert status["enabled"] is False
    assert status["buffered"] == 0
    assert status["state"] == "stopped"


async def test_bad_url_is_a_clear_error_not_a_crash(make_node) -> None:
    a = make_node("http://127.0.0.1:1", "a")
    await a.sync.start()
    status = a.sync.status()
    assert status["state"] == "down"
    assert "redis" in status["last_error"].lower()
    a.sync.publish(B1, [1])
