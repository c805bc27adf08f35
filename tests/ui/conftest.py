"""A simulator fleet and the proxy with an admin token, and conversation traffic through it."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

TOKEN = "ui-test-token"
FAST_SIM = {"speedup": 20.0, "default_max_tokens": 8}
DIALECTS = ["vllm", "sglang", "llamacpp"]


def admin(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def fleet():
    with SimFleet(n=3, dialect=DIALECTS, model="sim-model", **FAST_SIM) as f:
        yield f


@pytest.fixture(scope="module")
def proxy(fleet):
    with ProxyProcess(fleet.urls, config={"admin": {"token": TOKEN}}) as p:
        yield p


async def settled(http: aiohttp.ClientSession, url: str, timeout_s: float = 15.0) -> dict:
    """/ui/state once every backend has been scraped (its engine dialect is known)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        async with http.get(url + "/ui/state", headers=admin()) as r:
            doc = await r.json()
        if all(b["dialect"] and b["running"] is not None for b in doc["backends"]):
            return doc
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"backends not scraped within {timeout_s} s: {doc['backends']}")
        await asyncio.sleep(0.1)


async def converse(url: str, sessions: int = 6, turns: int = 4) -> int:
    """Agent-like sessions: each turn resends the whole, growing conversation. Returns 200s."""

    async def session(s: int, http: aiohttp.ClientSession) -> int:
        messages = [{"role": "system", "content": f"You are agent {s % 3}. " * 40}]
        ok = 0
        for t in range(turns):
            messages.append({"role": "user", "content": f"Session {s}, turn {t}: go on."})
            body = {"model": "sim-model", "messages": messages, "max_tokens": 4}
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                reply = await r.json()
                ok += r.status == 200
            content = reply["choices"][0]["message"]["content"] if r.status == 200 else ""
            messages.append({"role": "assistant", "content": content})
        return ok

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        return sum(await asyncio.gather(*(session(s, http) for s in range(sessions))))
