"""Faults with real processes: nothing is lost, nothing hangs, memory stays bounded."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time

import aiohttp
import orjson
import pytest

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

pytestmark = pytest.mark.asyncio
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "tell me a story"}]}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def stream_all(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bytes]:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        return r.status, await r.read()


async def test_backend_killed_mid_stream_loses_nothing():
    """One replica dies with streams in flight: those streams end with an error event, the
    other replica's streams finish, and every request sent afterwards succeeds."""
    async with SimFleet(n=2, speedup=1.0, decode_ms_per_token=40.0) as fleet:
        cfg = {"health": {"interval_s": 0.3, "eject_after_failures": 1}}
        with ProxyProcess(fleet.urls, policy="round-robin", config=cfg) as p:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
                body = dict(CHAT, stream=True, max_tokens=40)  # ~1.6 s each
                streams = [
                    asyncio.create_task(stream_all(s, p.url, dict(body, user=f"u{i}")))
                    for i in range(8)
                ]
                await asyncio.sleep(0.5)
                victim = fleet.replicas[0]
                os.kill(victim.proc.pid, signal.SIGKILL)
                results = await asyncio.wait_for(asyncio.gather(*streams), 20)
                broken = [b for st, b in results if b"upstream_midstream" in b]
                finished = [b for st, b in results if b.rstrip().endswith(b"data: [DONE]")]
                assert all(st == 200 for st, _ in results)
                assert broken, "streams on the killed replica must end with an error event"
                assert len(broken) + len(finished) == len(results)  # none hung, none vanished
                assert finished, "streams on the surviving replica are unaffected"
                after = await asyncio.gather(
                    *(
                        stream_all(s, p.url, dict(body, max_tokens=2, user=f"n{i}"))
                        for i in range(10)
                    )
                )
                assert [st for st, _ in after] == [200] * 10
                assert all(b.rstrip().endswith(b"data: [DONE]") for _, b in after)


async def test_slow_client_keeps_proxy_memory_bounded():
    """A client that reads nothing while the backend streams fast: backpressure holds the
    upstream, so the proxy does not buffer the answer (its RSS barely moves)."""
    async with SimFleet(n=1, speedup=50.0, max_model_len=200_000) as fleet:
        with ProxyProcess(fleet.urls) as p:
            async with aiohttp.ClientSession() as s:
                warm = dict(CHAT, max_tokens=4)
                await stream_all(s, p.url, warm)
                before = rss_kib(p.proc.pid)
                body = dict(CHAT, stream=True, max_tokens=150_000)  # ~25 MB of SSE
                r = await s.post(p.url + "/v1/chat/completions", json=body)
                await r.content.readline()
                await asyncio.sleep(3.0)  # the client stalls; the backend could finish by now
                stalled = rss_kib(p.proc.pid)
                r.close()
            assert stalled - before < 16 * 1024, (before, stalled)


async def test_slow_streaming_backend_delivers_each_chunk_as_it_comes():
    async with SimFleet(n=1, speedup=1.0) as fleet:
        await fleet.set_faults(0, chunk_delay_s=0.25)
        with ProxyProcess(fleet.urls) as p:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    p.url + "/v1/chat/completions", json=dict(CHAT, stream=True, max_tokens=6)
                ) as r,
            ):
                arrivals = []
                t0 = time.monotonic()
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        arrivals.append(time.monotonic() - t0)
            gaps = [b - a for a, b in itertools.pairwise(arrivals)]
            assert len(arrivals) >= 6
            assert sum(g > 0.15 for g in gaps) >= 4  # chunks came one by one, not in a lump


async def test_hanging_metrics_and_health_do_not_stop_routing():
    async with SimFleet(n=2, speedup=10.0) as fleet:
        cfg = {"scrape": {"timeout_s": 0.3, "stale_after_s": 1.0}}
        with ProxyProcess(fleet.urls, config=cfg) as p:
            await fleet.set_faults(0, metrics_delay_s=30.0)
            await fleet.set_faults(1, metrics_garbage=True)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:

                async def stale_lines() -> list[str]:
                    async with s.get(p.url + "/metrics") as r:
                        text = await r.text()
                    return [
                        ln
                        for ln in text.splitlines()
                        if ln.startswith("prefix_proxy_backend_load_stale{")
                    ]

                deadline = time.monotonic() + 5.0
                while not all(ln.endswith(" 1.0") for ln in await stale_lines()):
                    assert time.monotonic() < deadline, await stale_lines()
                    await asyncio.sleep(0.2)
                for i in range(20):  # routing goes on with local in-flight counts
                    status, _ = await stream_all(s, p.url, dict(CHAT, max_tokens=2, user=f"x{i}"))
                    assert status == 200


async def test_requests_during_config_reloads_are_not_dropped():
    async with SimFleet(n=2, speedup=5.0) as fleet:
        with ProxyProcess(fleet.urls, config={"admin": {"token": "t"}}) as p:
            async with aiohttp.ClientSession() as s:

                async def load() -> list[int]:
                    out = []
                    for i in range(40):
                        st, body = await stream_all(
                            s, p.url, dict(CHAT, stream=True, max_tokens=3, user=f"r{i}")
                        )
                        out.append(st if body.rstrip().endswith(b"[DONE]") else -1)
                    return out

                async def reloads() -> None:
                    for policy in ["least-load", "round-robin", "default"] * 3:
                        p.config["policy"] = policy
                        p.write_config()
                        p.signal(signal.SIGHUP)
                        await asyncio.sleep(0.1)

                statuses, _ = await asyncio.gather(
                    asyncio.gather(load(), load(), load()), reloads()
                )
            assert all(st == 200 for batch in statuses for st in batch)
            assert p.alive()


async def test_decision_header_is_valid_json():
    """The debug header is what operators paste into bug reports: it must parse."""
    async with SimFleet(n=2, speedup=10.0) as fleet:
        with ProxyProcess(fleet.urls) as p:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    p.url + "/v1/chat/completions",
                    json=dict(CHAT, max_tokens=2),
                    headers={"X-Prefix-Proxy-Debug": "1"},
                ) as r,
            ):
                decision = orjson.loads(r.headers["X-Prefix-Proxy-Decision"])
            assert decision["backend"] in fleet.urls
            assert set(decision["matched_blocks"]) == set(fleet.urls)
