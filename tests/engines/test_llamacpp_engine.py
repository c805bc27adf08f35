"""Direct checks (no proxy) that real llama-server replicas behave as the proxy assumes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from tests.engines.conftest import SHARED_FIXTURES, FleetFactory

if TYPE_CHECKING:
    from loadtests.engines.llamacpp import LlamaFleet

pytestmark = pytest.mark.engines

MODEL = "tiny-llama"
SYSTEM = (
    "You are a careful assistant for a fleet of coding agents. Answer in short sentences, "
    "cite the file you read, never invent an API, and keep every reply under forty words. "
) * 3


def chat_body(
    user: str, *, stream: bool = False, max_tokens: int = 4, system: str = SYSTEM
) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def parse_metrics(text: str) -> dict[str, float]:
    """llama.cpp's samples (it exports no labels); other lines, like a capture's trailer, skip."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as response:
        assert response.status == 200
        return parse_metrics(await response.text())


async def chat(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def cached_tokens_of(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """Send one chat request; return how much the cached-token counter grew, and the reply."""
    before = await metrics(session, url)
    reply = await chat(session, url, body)
    after = await metrics(session, url)
    key = "llamacpp:prompt_tokens_cached_total"
    return after[key] - before[key], reply


async def test_models_serves_the_alias(
    llama_fleet_factory: FleetFactory, http_session: aiohttp.ClientSession
) -> None:
    async with (
        llama_fleet_factory(n=1) as fleet,
        http_session.get(fleet.urls[0] + "/v1/models") as response,
    ):
        models = await response.json()
    assert [model["id"] for model in models["data"]] == [MODEL]


async def test_chat_non_stream(
    llama_fleet_factory: FleetFactory, http_session: aiohttp.ClientSession
) -> None:
    async with llama_fleet_factory(n=1) as fleet:
        reply = await chat(http_session, fleet.urls[0], chat_body("hello", max_tokens=6))
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["finish_reason"] in {"stop", "length"}
    assert reply["usage"]["prompt_tokens"] > 50
    assert 0 < reply["usage"]["completion_tokens"] <= 6


async def test_chat_stream_is_server_sent_events(
    llama_fleet_factory: FleetFactory, http_session: aiohttp.ClientSession
) -> None:
    async with llama_fleet_factory(n=1) as fleet:
        url = fleet.urls[0] + "/v1/chat/completions"
        async with http_session.post(url, json=chat_body("hello", stream=True)) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            payloads = [
                line.removeprefix(b"data: ").strip()
                async for line in response.content
                if line.startswith(b"data: ")
            ]
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["choices"][0]["finish_reason"] in {"stop", "length"}


async def test_metrics_have_the_names_the_proxy_reads(
    llama_fleet_factory: FleetFactory, http_session: aiohttp.ClientSession
) -> None:
    async with llama_fleet_factory(n=1) as fleet:
        names = set(await metrics(http_session, fleet.urls[0]))
    assert {
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:prompt_tokens_total",
        "llamacpp:prompt_tokens_cached_total",
    } <= names
    sample = SHARED_FIXTURES / "llama-server-lcp0.3.36" / "metrics.txt"
    if sample.exists():
        assert set(parse_metrics(sample.read_text())) == names


async def test_slots_and_props_describe_capacity_and_template(
    llama_fleet_factory: FleetFactory, http_session: aiohttp.ClientSession
) -> None:
    async with llama_fleet_factory(n=1, np=4, ctx=4096) as fleet:
        async with http_session.get(fleet.urls[0] + "/slots") as response:
            slots = await response.json()
        async with http_session.get(fleet.urls[0] + "/props") as response:
            props = await response.json()
    assert [slot["id"] for slot in slots] == [0, 1, 2, 3]
    assert {slot["n_ctx"] for slot in slots} == {1024}
    assert not any(slot["is_processing"] for slot in slots)
    assert props["total_slots"] == 4
    assert "<|im_start|>" in props["chat_template"]
    assert props["eos_token"] == "<|im_end|>"


async def test_repeated_and_extended_prompts_are_served_from_cache(
    llama_fleet_factory: FleetFactory, http_session: aiohttp.ClientSession
) -> None:
    turn = chat_body("what does main.py do?")
    async with llama_fleet_factory(n=1) as fleet:
        url = fleet.urls[0]
        cold, reply = await cached_tokens_of(http_session, url, turn)
        warm, warm_reply = await cached_tokens_of(http_session, url, turn)
        turn["messages"] += [reply["choices"][0]["message"], {"role": "user", "content": "and?"}]
        next_turn, _ = await cached_tokens_of(http_session, url, turn)
    prompt_tokens = reply["usage"]["prompt_tokens"]
    assert cold == 0
    assert warm == prompt_tokens - 1  # the last prompt token is always recomputed
    assert warm_reply["usage"]["prompt_tokens_details"]["cached_tokens"] == warm
    assert next_turn >= prompt_tokens - 1


async def test_cache_is_per_replica(
    llama_fleet: LlamaFleet, http_session: aiohttp.ClientSession
) -> None:
    body = chat_body("list the tests")
    first, *others = llama_fleet.urls
    await cached_tokens_of(http_session, first, body)
    for url in others:
        assert (await cached_tokens_of(http_session, url, body))[0] == 0
    assert (await cached_tokens_of(http_session, first, body))[0] > 50


@pytest.mark.parametrize(
    ("extra_args", "remembers_evicted"), [((), True), (("--cache-ram", "0"), False)]
)
async def test_host_ram_prompt_cache_restores_evicted_prompts(
    llama_fleet_factory: FleetFactory,
    http_session: aiohttp.ClientSession,
    extra_args: tuple[str, ...],
    remembers_evicted: bool,
) -> None:
    """One slot, prompts A, B, A: by default llama-server saves A to host RAM when B takes
    the slot and restores it; with `--cache-ram 0` a replica holds only its slots' prompts."""
    first = chat_body("what does main.py do?", system="Agent A. " + SYSTEM)
    second = chat_body("what does main.py do?", system="Agent B. " + SYSTEM)
    async with llama_fleet_factory(n=1, np=1, extra_args=extra_args) as fleet:
        url = fleet.urls[0]
        _, reply = await cached_tokens_of(http_session, url, first)
        await cached_tokens_of(http_session, url, second)
        again, _ = await cached_tokens_of(http_session, url, first)
    whole_prompt = reply["usage"]["prompt_tokens"] - 1
    if remembers_evicted:
        assert again == whole_prompt
    else:
        assert again < whole_prompt / 4  # only the chat template's opening is shared
