"""GET /ui and /ui/state on the real proxy process: access rules and what the JSON reports."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from loadtests.proxy_process import ProxyProcess
from tests.ui.conftest import DIALECTS, TOKEN, admin, converse, settled


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def state(http: aiohttp.ClientSession, url: str, query: str = "") -> dict:
    async with http.get(f"{url}/ui/state{query}", headers=admin()) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Cache-Control"] == "no-store"
        return await r.json()


async def test_page_wants_the_admin_token_as_header_or_query(proxy, http) -> None:
    for path, headers in [
        ("/ui", {}),
        ("/ui?token=wrong", {}),
        ("/ui", admin("wrong")),
        ("/ui/state", {}),
        (f"/ui/state?token={TOKEN}", {}),  # polls send the header; the query is for navigation
    ]:
        async with http.get(proxy.url + path, headers=headers) as r:
            assert r.status == 401, path
            assert (await r.json())["error"]["code"] == "invalid_admin_token"
    for path, headers in [(f"/ui?token={TOKEN}", {}), ("/ui", admin()), ("/ui/", admin())]:
        async with http.get(proxy.url + path, headers=headers) as r:
            assert r.status == 200, path
            assert r.content_type == "text/html"
            assert "default-src 'none'" in r.headers["Content-Security-Policy"]
            assert r.headers["Referrer-Policy"] == "no-referrer"
            assert "/state" in await r.text()


async def test_state_rejects_a_bad_decision_count(proxy, http) -> None:
    for raw in ("abc", "-1", "1.5", "²", ""):
        async with http.get(
            proxy.url + "/ui/state", params={"decisions": raw}, headers=admin()
        ) as r:
            assert r.status == 400, raw
            assert (await r.json())["error"]["param"] == "decisions"


async def test_state_reports_backends_rates_latency_and_decisions(proxy, fleet, http) -> None:
    before = await settled(http, proxy.url)
    assert before["policy"]
    assert before["cluster"] is None
    traffic = asyncio.create_task(converse(proxy.url))
    while not traffic.done():  # readings during the traffic give the rate window a baseline
        await state(http, proxy.url)
        await asyncio.sleep(0.5)
    ok = await traffic
    assert ok == 24
    after = await state(http, proxy.url)

    fleet_state = after["fleet"]
    assert (fleet_state["backends"], fleet_state["healthy"]) == (3, 3)
    assert fleet_state["requests_total"] - before["fleet"]["requests_total"] == ok
    assert fleet_state["requests_per_s"] > 0
    assert fleet_state["rate_window_s"] > 0
    assert fleet_state["ttft_count"] >= 1
    assert 0 < fleet_state["ttft_p50_s"] <= fleet_state["ttft_p99_s"]
    assert sum(d["total"] for d in fleet_state["decisions"]) >= ok
    assert all(d["recent"] is not None for d in fleet_state["decisions"])

    backends = {b["url"]: b for b in after["backends"]}
    assert {u: backends[u]["dialect"] for u in fleet.urls} == dict(
        zip(fleet.urls, DIALECTS, strict=True)
    )
    assert all(b["state"] == "healthy" and b["models"] == ["sim-model"] for b in backends.values())
    assert sum(b["requests"] for b in backends.values()) >= ok
    assert sum(b["requests_per_s"] for b in backends.values()) > 0
    assert any(b["predicted_hit_rate"] for b in backends.values())

    decisions = after["decisions"]
    assert 1 <= len(decisions) <= 20
    for d in decisions:
        assert d["backend"] in backends
        assert d["reason"] and d["blocks"] > 0
        assert set(d["total"]) <= set(backends)
    # A later turn of a conversation is routed where its prefix already is.
    assert any(d["matched_blocks"].get(d["backend"], 0) > 0 for d in decisions)
    assert len((await state(http, proxy.url, "?decisions=3"))["decisions"]) == 3
    assert (await state(http, proxy.url, "?decisions=0"))["decisions"] == []


async def test_without_an_admin_token_the_page_is_open_and_the_admin_api_off(fleet, http) -> None:
    async with ProxyProcess(fleet.urls) as open_proxy:
        async with http.get(open_proxy.url + "/ui") as r:
            assert r.status == 200
        async with http.get(open_proxy.url + "/ui/state") as r:
            assert r.status == 200
            assert len((await r.json())["backends"]) == 3
        async with http.get(open_proxy.url + "/admin/backends") as r:
            assert r.status == 403
