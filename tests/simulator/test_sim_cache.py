"""The simulator's prefix cache: chat template, block hashes, hits, LRU eviction, records."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.fleet import SimFleet
from tests.simulator.conftest import DIALECTS, get, post, post_json, sim_stats

BLOCK_CHARS = 64  # 16 tokens of 4 characters


def chatml(*turns: tuple[str, str]) -> str:
    """The ChatML text a conversation renders to, generation prompt included, written out
    by hand so the simulator's template is checked against it."""
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + "<|im_start|>assistant\n"


def chat(url: str, messages: list[dict[str, str]], max_tokens: int = 8) -> dict:
    status, body = post_json(
        url + "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens}
    )
    assert status == 200, body
    return body


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_repeated_prompt_hits_the_cache(urls: dict[str, str], dialect: str) -> None:
    messages = [
        {"role": "system", "content": "You are a careful assistant. " * 12},
        {"role": "user", "content": "Summarize the report."},
    ]
    text = chatml(("system", messages[0]["content"]), ("user", messages[1]["content"]))
    first = chat(urls[dialect], messages)
    second = chat(urls[dialect], messages)
    prompt_tokens = math.ceil(len(text) / 4)
    assert first["usage"]["prompt_tokens"] == prompt_tokens
    assert cached(first) == 0
    assert cached(second) == (prompt_tokens - 1) // 16 * 16
    totals = sim_stats(urls[dialect])["totals"]
    assert totals["cached_tokens"] == cached(second)
    assert totals["prompt_tokens"] == 2 * prompt_tokens


def test_next_turn_hits_prompt_and_generated_blocks(urls: dict[str, str]) -> None:
    url = urls["vllm"]
    history = [{"role": "user", "content": "Explain the build failure in detail. " * 5}]
    first = chat(url, history, max_tokens=40)
    reply = first["choices"][0]["message"]["content"]
    history += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And how do we fix it?"},
    ]
    second = chat(url, history)
    turn_one = chatml(("user", history[0]["content"])) + reply
    assert second["usage"]["prompt_tokens"] == math.ceil(
        len(chatml(*((m["role"], m["content"]) for m in history))) / 4
    )
    assert cached(second) == len(turn_one) // BLOCK_CHARS * 16
    assert cached(second) > first["usage"]["prompt_tokens"], "generated blocks were kept"


def test_tools_are_rendered_into_the_system_turn(urls: dict[str, str]) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    status, body = post_json(
        urls["vllm"] + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]},
    )
    assert status == 200
    expected = (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions. Function "
        f"signatures:\n<tools>\n{json.dumps(tool)}\n</tools><|im_end|>\n" + chatml(("user", "hi"))
    )
    assert body["usage"]["prompt_tokens"] == math.ceil(len(expected) / 4)


def test_records_carry_block_hashes_and_tracing_headers(urls: dict[str, str]) -> None:
    prompt = "x" * 200 + "tail"
    for dialect in ("vllm", "sglang"):
        headers = {
            "X-Request-ID": f"req-{dialect}",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "X-Session-ID": "agent-7",
        }
        status, _ = post(
            urls[dialect] + "/v1/completions", {"prompt": prompt, "max_tokens": 2}, headers
        )
        assert status == 200
    vllm_record = sim_stats(urls["vllm"])["records"][0]
    sglang_record = sim_stats(urls["sglang"])["records"][0]
    assert len(vllm_record["block_hashes"]) == len(prompt) // BLOCK_CHARS
    assert vllm_record["block_hashes"] == sglang_record["block_hashes"], "replica-independent"
    assert vllm_record["x_request_id"] == "req-vllm"
    assert vllm_record["x_session_id"] == "agent-7"
    assert vllm_record["traceparent"].startswith("00-0af7")
    assert vllm_record["prompt_tokens"] == 51 and vllm_record["completion_tokens"] == 2
    assert vllm_record["finish_reason"] == "length"
    assert vllm_record["ttft_s"] <= vllm_record["e2e_s"]
    assert "records" not in json.loads(get(urls["vllm"] + "/sim/stats?records=0")[1])
    light = json.loads(get(urls["vllm"] + "/sim/stats?hashes=0")[1])["records"][0]
    assert "block_hashes" not in light and light["x_request_id"] == "req-vllm"


def test_reset_clears_cache_and_stats(urls: dict[str, str]) -> None:
    url = urls["llamacpp"]
    body = {"prompt": "y" * 300, "max_tokens": 2}
    post(url + "/v1/completions", body)
    post(url + "/sim/reset", {})
    assert sim_stats(url)["totals"]["requests"] == 0
    assert sim_stats(url)["cached_blocks"] == 0
    _, again = post_json(url + "/v1/completions", body)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_custom_chat_template_is_used_and_served(tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    path = tmp_path / "template.jinja"
    path.write_text(template)
    with SimFleet(n=1, dialect="llamacpp", chat_template=path) as fleet:
        body = chat(fleet.urls[0], [{"role": "user", "content": "a" * 61}])
        assert body["usage"]["prompt_tokens"] == math.ceil((6 + 61 + 11) / 4)
        assert json.loads(get(fleet.urls[0] + "/props")[1])["chat_template"] == template


@pytest.fixture(scope="module")
def tiny_cache() -> Iterator[str]:
    """A replica that holds 4 blocks and caches prompts only."""
    with SimFleet(n=1, capacity_tokens=64, no_cache_generated=True, speedup=50) as fleet:
        yield fleet.urls[0]


def test_eviction_is_lru_and_leaf_first(tiny_cache: str) -> None:
    url = tiny_cache
    post(url + "/sim/reset", {})
    a = "".join(f"a{i:03d}" for i in range(100))  # 400 chars, 6 full blocks, 100 tokens
    b = "".join(f"b{i:03d}" for i in range(100))

    def hit(prompt: str) -> int:
        status, body = post_json(url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert status == 200
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert hit(a) == 0
    assert hit(a) == 64, "the 4 root blocks stayed, the 2 leaf blocks were evicted"
    assert hit(b) == 0
    assert hit(a) == 0, "b pushed all of a out"
    stats = sim_stats(url)
    assert stats["cached_blocks"] == 4
    assert stats["evicted_blocks"] > 0
