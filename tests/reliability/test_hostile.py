"""Hostile input and access control, against the real proxy process."""

from __future__ import annotations

import asyncio
import select
import socket

import aiohttp
import orjson
import pytest

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

pytestmark = pytest.mark.asyncio
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LIMITS = {"limits": {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "max_header_bytes": 8192}}


@pytest.fixture(scope="module")
def fleet():
    with SimFleet(n=2, speedup=20.0) as f:
        yield f


@pytest.fixture(scope="module")
def proxy(fleet):
    with ProxyProcess(fleet.urls, config=LIMITS | {"admin": {"token": "adm"}}) as p:
        yield p


def raw_exchange(url: str, payload: bytes, wait_s: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(payload)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


async def still_serving(proxy) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(proxy.url + "/v1/chat/completions", json=CHAT) as r,
    ):
        assert r.status == 200


async def test_slowloris_headers_are_cut_off(proxy):
    """A head trickled one header every 0.25 s is cut off by the 1 s head deadline, long
    before the trickle (20 headers) would have ended."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        sent = 0
        while sent < 20 and not _closed(s):
            s.sendall(b"X-Slow: a\r\n")
            sent += 1
            await asyncio.sleep(0.25)
        assert _closed(s) or s.recv(1) == b""
    assert sent < 20
    await still_serving(proxy)


def _closed(s: socket.socket) -> bool:
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


async def test_slow_body_gets_408(proxy):
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": '
    )
    reply = await asyncio.to_thread(raw_exchange, proxy.url, head, 5.0)
    assert reply.startswith(b"HTTP/1.1 408")
    assert b'"code":"body_timeout"' in reply
    await still_serving(proxy)


async def test_oversized_header_is_refused(proxy):
    payload = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    reply = await asyncio.to_thread(raw_exchange, proxy.url, payload, 3.0)
    assert reply.split(b" ")[1] in (b"400", b"431")
    await still_serving(proxy)


async def test_crlf_injection_in_header_values_is_refused(proxy):
    payload = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-ID: a\rInjected: b\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    reply = await asyncio.to_thread(raw_exchange, proxy.url, payload, 3.0)
    assert reply.split(b" ")[1] == b"400"
    await still_serving(proxy)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 5000 + b"]" * 5000,
        b'{"model": "sim-model", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "sim-model", "messages": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}",
    ],
    ids=["deeply-nested", "invalid-utf8", "nested-object"],
)
async def test_hostile_bodies_get_400(proxy, body):
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            proxy.url + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as r,
    ):
        assert r.status == 400
        assert set((await r.json())["error"]) == {"message", "type", "param", "code"}
    await still_serving(proxy)


async def test_absurd_parameters_pass_through_to_the_engine_unchanged(proxy, fleet):
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.url + "/v1/chat/completions", json=CHAT | {"n": 10**9}) as r:
            assert r.status == 200  # the proxy does not police `n`; the engine ignores it here
        huge = CHAT | {"max_tokens": 2**40}
        async with s.post(proxy.url + "/v1/chat/completions", json=huge) as via_proxy:
            proxied = (via_proxy.status, await via_proxy.read())
        async with s.post(fleet.urls[0] + "/v1/chat/completions", json=huge) as direct:
            straight = (direct.status, await direct.read())
    assert proxied[0] == straight[0]  # whatever the engine says about it, the client hears
    assert orjson.loads(proxied[1]).keys() == orjson.loads(straight[1]).keys()


@pytest.mark.parametrize(
    "path",
    [
        "/admin/../admin/backends",
        "/admin/%2e%2e/admin/backends",
        "/admin/backends/../../etc/passwd",
        "/admin//backends",
        "/%61dmin/backends",
    ],
)
async def test_admin_path_tricks_never_bypass_the_token(proxy, path):
    payload = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    reply = await asyncio.to_thread(raw_exchange, proxy.url, payload, 3.0)
    status = reply.split(b" ")[1]
    assert status in (b"400", b"401", b"403", b"404"), reply[:200]


async def test_client_api_keys_and_upstream_authorization_modes(fleet):
    keys = {"auth": {"api_keys": ["client-key-1"]}}
    modes = {
        "pass": None,  # with client keys configured, the client's key never reaches the engine
        "drop": None,
        "replace": "Bearer engine-token",
    }
    async with aiohttp.ClientSession() as s:
        for mode, expected in modes.items():
            upstream = {"authorization": mode} | (
                {"token": "engine-token"} if mode == "replace" else {}
            )
            with ProxyProcess(fleet.urls, config=keys | {"upstream": upstream}) as p:
                async with s.post(p.url + "/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 401
                    assert (await r.json())["error"]["code"] == "invalid_api_key"
                bad = {"Authorization": "Bearer nope"}
                async with s.post(p.url + "/v1/chat/completions", json=CHAT, headers=bad) as r:
                    assert r.status == 401
                await fleet.reset()
                good = {"Authorization": "Bearer client-key-1", "X-Request-ID": f"auth-{mode}"}
                async with s.post(p.url + "/v1/chat/completions", json=CHAT, headers=good) as r:
                    assert r.status == 200
                records = [r for st in await fleet.stats() for r in st["records"]]
                seen = [r["authorization"] for r in records if r["x_request_id"] == f"auth-{mode}"]
                assert seen == [expected]
        with ProxyProcess(fleet.urls) as p:  # no client keys: the client's header passes on
            await fleet.reset()
            hdr = {"Authorization": "Bearer user-token", "X-Request-ID": "auth-open"}
            async with s.post(p.url + "/v1/chat/completions", json=CHAT, headers=hdr) as r:
                assert r.status == 200
            records = [r for st in await fleet.stats() for r in st["records"]]
            assert [r["authorization"] for r in records if r["x_request_id"] == "auth-open"] == [
                "Bearer user-token"
            ]
