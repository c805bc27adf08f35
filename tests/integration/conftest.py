"""Real processes on loopback: a simulator fleet and the proxy in front of it."""

from __future__ import annotations

import aiohttp
import pytest
import pytest_asyncio

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

FAST_SIM = {
    "speedup": 20.0,
    "default_max_tokens": 8,
}


@pytest.fixture(scope="module")
def fleet():
    with SimFleet(n=3, dialect="vllm", model="sim-model", **FAST_SIM) as f:
        yield f


@pytest.fixture(scope="module")
def proxy(fleet):
    cfg = {
        "upstream": {"first_byte_timeout_s": 2.0, "max_attempts": 3},
        "limits": {"max_body_bytes": 1_000_000},
    }
    with ProxyProcess(fleet.urls, policy="default", config=cfg) as p:
        yield p


@pytest_asyncio.fixture
async def client():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


@pytest_asyncio.fixture
async def clean(fleet):
    """Every test starts with empty simulator caches, stats and no faults."""
    await fleet.reset()
    yield fleet
    await fleet.reset()
