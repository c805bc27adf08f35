"""Discovery through the real proxy process: Kubernetes EndpointSlices from a fake API
server. A joining backend starts cold and takes traffic; a leaving one drains and its
prefix-index entries go."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess
from tests.integration.test_discovery_kubernetes import TOKEN, FakeApiServer, endpoint_slice

pytestmark = pytest.mark.asyncio
ADMIN = {"Authorization": "Bearer adm"}


def slice_for(name: str, version: str, url: str) -> dict:
    host, port = url.removeprefix("http://").split(":")
    doc = endpoint_slice(name, version, (host, True))
    doc["ports"] = [{"name": "http", "port": int(port), "protocol": "TCP"}]
    return doc


async def listed(session: aiohttp.ClientSession, proxy: ProxyProcess) -> dict[str, dict]:
    async with session.get(proxy.url + "/admin/backends", headers=ADMIN) as r:
        return {b["url"]: b for b in (await r.json())["backends"]}


async def wait_for(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def test_backends_join_cold_and_leave_with_their_index_entries(tmp_path):
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    try:
        async with SimFleet(n=2, speedup=20.0) as fleet:
            a, b = fleet.urls
            fake.slices = [slice_for("vllm-a", "101", a)]
            cfg = {
                "admin": {"token": "adm"},
                "backends": {
                    "static": [],
                    "kubernetes": {
                        "service": "vllm",
                        "namespace": "inference",
                        "port_name": "http",
                        "api_server": str(server.make_url("")).rstrip("/"),
                        "token_path": str(token),
                    },
                },
            }
            async with ProxyProcess([], config=cfg) as p, aiohttp.ClientSession() as s:
                await wait_for(lambda: _has(s, p, {a}))
                question = {"role": "user", "content": "a long enough question " * 20}
                chat = {"model": "sim-model", "max_tokens": 2, "messages": [question]}
                async with s.post(p.url + "/v1/chat/completions", json=chat) as r:
                    assert r.status == 200
                assert (await listed(s, p))[a]["index_blocks"] > 0

                fake.push("ADDED", slice_for("vllm-b", "102", b))
                await wait_for(lambda: _has(s, p, {a, b}))
                joined = (await listed(s, p))[b]
                assert joined["index_blocks"] == 0 and joined["requests"] == 0  # cold

                fake.push("DELETED", slice_for("vllm-a", "103", a))
                await wait_for(lambda: _has(s, p, {b}))
                for i in range(4):
                    body = chat | {"user": f"u{i}"}
                    async with s.post(p.url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
                now = await listed(s, p)
                assert set(now) == {b} and now[b]["requests"] == 4
    finally:
        fake.events.put_nowait(None)
        await server.close()


async def _has(s: aiohttp.ClientSession, p: ProxyProcess, urls: set[str]) -> bool:
    got = await listed(s, p)
    return set(got) == urls and all(b["healthy"] for b in got.values())
