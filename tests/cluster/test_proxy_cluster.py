"""Proxy processes sharing what they know through a real redis-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
import pytest

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

pytestmark = pytest.mark.asyncio
ADMIN = {"Authorization": "Bearer adm"}
SYSTEM = {"role": "system", "content": "You review pull requests for a storage engine. " * 30}


def cluster_config(url: str) -> dict:
    return {"admin": {"token": "adm"}, "cluster": {"redis_url": url, "flush_interval_s": 0.02}}


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def admin(s: aiohttp.ClientSession, p: ProxyProcess) -> dict:
    async with s.get(p.url + "/admin/backends", headers=ADMIN) as r:
        return await r.json()


async def chat(s: aiohttp.ClientSession, p: ProxyProcess, messages: list) -> tuple[int, dict]:
    body = {"model": "sim-model", "messages": messages, "max_tokens": 2}
    async with s.post(
        p.url + "/v1/chat/completions", json=body, headers={"X-Prefix-Proxy-Debug": "1"}
    ) as r:
        await r.read()
        return r.status, orjson.loads(r.headers.get("X-Prefix-Proxy-Decision", "{}"))


async def test_a_peer_routes_a_conversation_it_never_saw_to_where_it_lives(redis_server):
    redis = redis_server()
    async with SimFleet(n=4, speedup=20.0) as fleet:
        with (
            ProxyProcess(fleet.urls, config=cluster_config(redis.url)) as a,
            ProxyProcess(fleet.urls, config=cluster_config(redis.url)) as b,
        ):
            async with aiohttp.ClientSession() as s:
                await wait_until(lambda: _up(s, a))
                await wait_until(lambda: _up(s, b))
                turn1 = [SYSTEM, {"role": "user", "content": "Review the WAL patch."}]
                status, first = await chat(s, a, turn1)
                assert status == 200
                home = first["backend"]

                async def b_learned() -> bool:
                    return any(
                        x["url"] == home and x["index_blocks"] > 0
                        for x in (await admin(s, b))["backends"]
                    )

                await wait_until(b_learned)
                turn2 = [*turn1, {"role": "assistant", "content": "Looks fine."},
                         {"role": "user", "content": "And the compaction patch?"}]  # fmt: skip
                status, second = await chat(s, b, turn2)
                assert status == 200
                assert second["backend"] == home
                assert second["matched_blocks"][home] > 0
                assert all(m == 0 for u, m in second["matched_blocks"].items() if u != home)


async def _up(s: aiohttp.ClientSession, p: ProxyProcess) -> bool:
    return (await admin(s, p))["cluster"]["up"] is True


async def test_redis_killed_under_load_fails_no_request_and_sync_resumes(redis_server):
    redis = redis_server()
    async with SimFleet(n=2, speedup=20.0) as fleet:
        with ProxyProcess(fleet.urls, config=cluster_config(redis.url)) as p:
            async with aiohttp.ClientSession() as s:
                await wait_until(lambda: _up(s, p))
                statuses: list[int] = []

                async def load(seconds: float) -> None:
                    end = time.monotonic() + seconds
                    i = 0
                    while time.monotonic() < end:
                        i += 1
                        msgs = [SYSTEM, {"role": "user", "content": f"question {i}"}]
                        statuses.append((await chat(s, p, msgs))[0])

                task = asyncio.create_task(load(6.0))
                await asyncio.sleep(1.0)
                redis.kill()
                await wait_until(lambda: _down(s, p))
                async with s.get(p.url + "/metrics") as r:
                    assert "prefix_proxy_cluster_sync_up 0.0" in await r.text()
                await asyncio.sleep(1.0)
                redis.start()
                await wait_until(lambda: _up(s, p), timeout_s=20.0)
                await task
            assert len(statuses) > 20
            assert set(statuses) == {200}
            logs = p.logs()
            assert logs.count("cluster sync down") <= 2, logs  # one line per state change


async def _down(s: aiohttp.ClientSession, p: ProxyProcess) -> bool:
    return (await admin(s, p))["cluster"]["up"] is False


async def test_workers_share_one_port_and_the_index(redis_server):
    redis = redis_server()
    async with SimFleet(n=2, speedup=20.0) as fleet:
        with ProxyProcess(fleet.urls, config=cluster_config(redis.url), workers=2) as p:
            nodes: set[str] = set()

            async def both_answer() -> bool:
                async with (
                    aiohttp.ClientSession() as s
                ):  # a new connection: the kernel spreads them
                    nodes.add((await admin(s, p))["cluster"]["node_id"])
                return len(nodes) == 2

            await wait_until(both_answer, timeout_s=20.0)
            async with aiohttp.ClientSession() as s:
                for i in range(10):
                    status, _ = await chat(s, p, [SYSTEM, {"role": "user", "content": f"w{i}"}])
                    assert status == 200
