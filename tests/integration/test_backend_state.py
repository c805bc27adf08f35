"""Backend state through real sockets: scraping in three dialects, health and ejection,
the admin API, hot reload and graceful shutdown."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

pytestmark = pytest.mark.asyncio
TOKEN = "s3cret-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


async def eventually(check, timeout=5.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(interval)


async def backends(session, proxy):
    async with session.get(proxy.url + "/admin/backends", headers=ADMIN) as r:
        assert r.status == 200
        return {b["url"]: b for b in (await r.json())["backends"]}


@pytest.fixture(scope="module")
def mixed_fleet():
    with SimFleet(n=3, dialect=["vllm", "sglang", "llamacpp"], speedup=10.0) as f:
        yield f


@pytest.fixture
def admin_proxy(mixed_fleet):
    with ProxyProcess(mixed_fleet.urls, config={"admin": {"token": TOKEN}}) as p:
        yield p


async def test_scrapes_all_three_dialects_into_one_picture(mixed_fleet, admin_proxy):
    async with aiohttp.ClientSession() as s:

        async def scraped():
            got = await backends(s, admin_proxy)
            return got if all(b["dialect"] for b in got.values()) else None

        got = await eventually(scraped)
        assert got, "every backend should have been scraped"
        dialects = {got[u]["dialect"] for u in mixed_fleet.urls}
        assert dialects == {"vllm", "sglang", "llamacpp"}
        for b in got.values():
            assert b["healthy"] and not b["load_stale"]
            assert b["models"] == ["sim-model"]
            assert b["running"] == 0 and b["waiting"] == 0
            assert b["kv_capacity_tokens"] and b["kv_capacity_tokens"] > 0
            # The index capacity follows the engine's KV capacity (128-byte blocks ~ 32 tokens).
            assert b["index_capacity_blocks"] == b["kv_capacity_tokens"] // 32


async def test_admin_api_refuses_without_token_and_manages_backends(mixed_fleet, admin_proxy):
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            async with s.get(admin_proxy.url + "/admin/backends", headers=headers) as r:
                assert r.status == 401
                assert (await r.json())["error"]["code"] == "invalid_admin_token"
        async with s.get(admin_proxy.url + "/admin/../admin/backends") as r:
            assert r.status in (401, 404)
        victim = mixed_fleet.urls[0]
        async with s.post(
            admin_proxy.url + "/admin/backends/drain", json={"url": victim}, headers=ADMIN
        ) as r:
            assert r.status == 200
        assert (await backends(s, admin_proxy))[victim]["draining"]
        for _ in range(6):  # a drained backend gets no new requests
            async with s.post(
                admin_proxy.url + "/v1/chat/completions",
                json=CHAT,
                headers={"X-Prefix-Proxy-Debug": "1"},
            ) as r:
                assert r.status == 200
                assert (
                    victim not in r.headers["X-Prefix-Proxy-Decision"].split('"backend":')[1][:60]
                )
        async with s.delete(
            admin_proxy.url + "/admin/backends", params={"url": victim}, headers=ADMIN
        ) as r:
            assert r.status == 200
        assert victim not in await backends(s, admin_proxy)
        async with s.post(
            admin_proxy.url + "/admin/backends", json={"url": victim}, headers=ADMIN
        ) as r:
            assert r.status == 201
            assert (await r.json())["healthy"] is True
        assert victim in await backends(s, admin_proxy)
        async with s.post(
            admin_proxy.url + "/admin/backends", json={"url": "file:///etc/passwd"}, headers=ADMIN
        ) as r:
            assert r.status == 400


async def test_admin_api_is_off_without_a_configured_token(mixed_fleet):
    with ProxyProcess(mixed_fleet.urls) as p:
        async with aiohttp.ClientSession() as s, s.get(p.url + "/admin/backends") as r:
            assert r.status == 403


async def test_garbage_metrics_mark_load_stale_and_routing_continues():
    async with SimFleet(n=2, speedup=10.0) as fleet:
        cfg = {"admin": {"token": TOKEN}, "scrape": {"stale_after_s": 1.0}}
        with ProxyProcess(fleet.urls, config=cfg) as p:
            await fleet.set_faults(0, metrics_garbage=True)
            await fleet.set_faults(1, metrics_delay_s=5.0)
            async with aiohttp.ClientSession() as s:

                async def stale():
                    got = await backends(s, p)
                    return all(b["load_stale"] for b in got.values())

                assert await eventually(stale, timeout=6.0)
                for _ in range(5):
                    async with s.post(p.url + "/v1/chat/completions", json=CHAT) as r:
                        assert r.status == 200
                async with s.get(p.url + "/metrics") as r:
                    text = await r.text()
                assert 'outcome="unparseable"' in text
                assert "prefix_proxy_backend_load_stale" in text


async def test_dead_backend_is_ejected_and_requests_go_elsewhere():
    async with SimFleet(n=2, speedup=10.0) as fleet:
        cfg = {"admin": {"token": TOKEN}, "health": {"eject_after_failures": 1, "interval_s": 0.3}}
        with ProxyProcess(fleet.urls, config=cfg) as p:
            fleet.replicas[0].stop()  # killed: connection refused from now on
            async with aiohttp.ClientSession() as s:
                for i in range(10):
                    body = dict(CHAT, messages=[{"role": "user", "content": f"q{i}"}])
                    async with s.post(p.url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200  # retried before the first byte, nothing lost

                async def marked_down():
                    b = (await backends(s, p))[fleet.urls[0]]
                    return not b["healthy"] or b["ejected"]

                assert await eventually(marked_down)
                async with s.get(p.url + "/ready") as r:
                    assert r.status == 200 and (await r.json())["healthy_backends"] == 1


async def test_sighup_reload_swaps_policy_and_rejects_an_invalid_file(mixed_fleet):
    with ProxyProcess(mixed_fleet.urls, config={"admin": {"token": TOKEN}}) as p:
        async with aiohttp.ClientSession() as s:

            async def policy():
                async with s.get(p.url + "/admin/backends", headers=ADMIN) as r:
                    return (await r.json())["policy"]

            assert await policy() == "default"
            p.config["policy"] = "least-load"
            p.write_config()
            p.signal(signal.SIGHUP)
            assert await eventually(lambda: _eq(policy, "least-load"))
            p.config_path.write_text("policy: [broken\n")
            p.signal(signal.SIGHUP)
            async with s.post(p.url + "/admin/reload", headers=ADMIN) as r:
                assert r.status == 400
                assert "old config kept" in (await r.json())["error"]["message"]
            assert await policy() == "least-load"
            async with s.post(p.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
            assert p.alive()
            async with s.get(p.url + "/metrics") as r:
                assert 'prefix_proxy_config_reloads_total{outcome="rejected"}' in await r.text()


async def _eq(fn, value):
    return await fn() == value


async def test_streams_survive_reload_and_sigterm_drains_in_flight():
    async with SimFleet(n=2, speedup=1.0, decode_ms_per_token=100.0) as fleet:
        with ProxyProcess(fleet.urls, config={"admin": {"token": TOKEN}}) as p:
            async with aiohttp.ClientSession() as s:
                body = dict(CHAT, stream=True, max_tokens=15)  # ~1.5 s of streaming
                r = await s.post(p.url + "/v1/chat/completions", json=body)
                assert r.status == 200
                await r.content.readline()
                p.config["policy"] = "round-robin"
                p.write_config()
                async with s.post(p.url + "/admin/reload", headers=ADMIN) as rr:
                    assert rr.status == 200
                r2 = await s.post(p.url + "/v1/chat/completions", json=body)
                await r2.content.readline()
                p.signal(signal.SIGTERM)  # graceful: stop accepting, finish both streams
                rest1, rest2 = await asyncio.gather(r.read(), r2.read())
                assert rest1.rstrip().endswith(b"data: [DONE]")
                assert rest2.rstrip().endswith(b"data: [DONE]")
            assert p.proc.wait(10) == 0


async def test_config_file_change_is_picked_up_without_a_signal(mixed_fleet):
    with ProxyProcess(mixed_fleet.urls, config={"admin": {"token": TOKEN}}) as p:
        async with aiohttp.ClientSession() as s:

            async def policy():
                async with s.get(p.url + "/admin/backends", headers=ADMIN) as r:
                    return (await r.json())["policy"]

            await asyncio.sleep(1.1)  # a different mtime second from the file as written
            p.config["policy"] = "throughput"
            p.write_config()
            assert await eventually(lambda: _eq(policy, "throughput"), timeout=8.0)
