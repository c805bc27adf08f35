"""The simulator answers in the real engines' wire formats (compared with captured samples)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.simulator.conftest import (
    DIALECTS,
    LLAMACPP_FIXTURES,
    VLLM_FIXTURES,
    fixture_sse,
    fixture_text,
    get,
    parse_sse,
    post,
    post_json,
)

CHAT: dict[str, Any] = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "hello there"}],
    "max_tokens": 5,
}
STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}


def stream_chunks(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    status, text = post(url + "/v1/chat/completions", body)
    assert status == 200
    events = parse_sse(text)
    assert events[-1] == (None, "[DONE]")
    return [json.loads(data) for _, data in events[:-1]]


def chunk_shape(chunk: dict[str, Any]) -> tuple[list[str], list[tuple[list[str], list[str]]]]:
    choices = [(list(c), sorted(c["delta"])) for c in chunk["choices"]]
    return list(chunk), choices


@pytest.mark.parametrize("dialect", DIALECTS)
def test_chat_stream_is_framed_and_ends_with_usage(urls: dict[str, str], dialect: str) -> None:
    chunks = stream_chunks(urls[dialect], {**CHAT, **STREAM_USAGE})
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(text) == 5 * 4, "five 4-character filler tokens"
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_chat_stream_without_include_usage_has_no_usage_chunk(
    urls: dict[str, str], dialect: str
) -> None:
    chunks = stream_chunks(urls[dialect], {**CHAT, "stream": True})
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any(c.get("usage") for c in chunks)


@pytest.mark.parametrize(
    ("dialect", "samples"), [("vllm", VLLM_FIXTURES), ("llamacpp", LLAMACPP_FIXTURES)]
)
def test_chat_stream_chunks_have_the_engine_shape(
    urls: dict[str, str], dialect: str, samples: Any
) -> None:
    real = fixture_sse(samples / "chat_stream.txt")
    ours = stream_chunks(urls[dialect], {**CHAT, **STREAM_USAGE})
    assert chunk_shape(ours[0]) == chunk_shape(real[0]), "role chunk"
    assert chunk_shape(ours[1]) == chunk_shape(real[1]), "content chunk"
    assert chunk_shape(ours[-2]) == chunk_shape(real[-2]), "finish chunk"
    assert list(ours[-1]) == list(real[-1]), "usage chunk"
    assert set(real[-1]["usage"]) <= set(ours[-1]["usage"])


@pytest.mark.parametrize(
    ("dialect", "samples"), [("vllm", VLLM_FIXTURES), ("llamacpp", LLAMACPP_FIXTURES)]
)
def test_chat_nonstream_has_the_engine_shape(
    urls: dict[str, str], dialect: str, samples: Any
) -> None:
    real = json.loads(fixture_text(samples / "chat_nonstream.json"))
    status, ours = post_json(urls[dialect] + "/v1/chat/completions", CHAT)
    assert status == 200
    assert list(ours) == list(real)
    assert list(ours["choices"][0]) == list(real["choices"][0])
    assert list(ours["choices"][0]["message"]) == list(real["choices"][0]["message"])
    assert list(ours["usage"]) == list(real["usage"])
    assert ours["choices"][0]["finish_reason"] == "length"
    assert ours["usage"]["completion_tokens"] == 5


def test_sglang_nonstream_is_openai_shaped(urls: dict[str, str]) -> None:
    status, body = post_json(urls["sglang"] + "/v1/chat/completions", CHAT)
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert len(body["choices"][0]["message"]["content"]) == 20


@pytest.mark.parametrize(
    ("dialect", "samples"), [("vllm", VLLM_FIXTURES), ("llamacpp", LLAMACPP_FIXTURES)]
)
def test_models_listing_has_the_engine_shape(
    urls: dict[str, str], dialect: str, samples: Any
) -> None:
    real = json.loads(fixture_text(samples / "models.json"))
    status, text = get(urls[dialect] + "/v1/models")
    ours = json.loads(text)
    assert status == 200
    assert set(ours) == set(real)
    assert set(ours["data"][0]) == set(real["data"][0])
    assert ours["data"][0]["id"] == "sim-model"


def test_answers_are_deterministic_and_default_to_16_tokens(urls: dict[str, str]) -> None:
    body = {"messages": [{"role": "user", "content": "same question"}]}
    _, first = post_json(urls["vllm"] + "/v1/chat/completions", body)
    _, second = post_json(urls["vllm"] + "/v1/chat/completions", {**body, "n": 3})
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert first["usage"]["completion_tokens"] == 16
    assert len(second["choices"]) == 1, "n is ignored"


def test_completions_stream_and_nonstream(urls: dict[str, str]) -> None:
    url = urls["vllm"] + "/v1/completions"
    status, body = post_json(url, {"prompt": "Once upon a time", "max_tokens": 3})
    assert status == 200
    assert body["object"] == "text_completion"
    assert len(body["choices"][0]["text"]) == 12
    assert body["usage"]["prompt_tokens"] == 4
    status, text = post(url, {"prompt": "Once upon a time", "max_tokens": 3, **STREAM_USAGE})
    events = parse_sse(text)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert (
        "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        == body["choices"][0]["text"]
    )
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_responses_api_minimal(urls: dict[str, str]) -> None:
    url = urls["vllm"] + "/v1/responses"
    request = {"model": "sim-model", "input": "hi", "instructions": "be brief"}
    status, body = post_json(url, {**request, "max_output_tokens": 4})
    assert status == 200
    assert body["object"] == "response" and body["status"] == "completed"
    assert len(body["output"][0]["content"][0]["text"]) == 16
    assert body["usage"]["output_tokens"] == 4
    status, text = post(url, {**request, "max_output_tokens": 4, "stream": True})
    names = [event for event, _ in parse_sse(text)]
    assert names == ["response.created"] + ["response.output_text.delta"] * 4 + [
        "response.completed"
    ]


def test_anthropic_messages_minimal(urls: dict[str, str]) -> None:
    url = urls["sglang"] + "/v1/messages"
    request = {
        "model": "sim-model",
        "system": "be brief",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    status, body = post_json(url, request)
    assert status == 200
    assert body["type"] == "message" and body["stop_reason"] == "max_tokens"
    assert body["content"][0]["type"] == "text" and len(body["content"][0]["text"]) == 12
    status, text = post(url, {**request, "stream": True})
    names = [event for event, _ in parse_sse(text)]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_embeddings_are_small_and_deterministic(urls: dict[str, str]) -> None:
    url = urls["llamacpp"] + "/v1/embeddings"
    status, body = post_json(url, {"model": "sim-model", "input": ["a", "b"]})
    assert status == 200
    vectors = [d["embedding"] for d in body["data"]]
    assert len(vectors) == 2 and all(len(v) == 8 for v in vectors)
    assert vectors[0] != vectors[1]
    _, again = post_json(url, {"input": "a"})
    assert again["data"][0]["embedding"] == vectors[0]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_openai_sdk_talks_to_the_simulator(urls: dict[str, str], dialect: str) -> None:
    client = openai.OpenAI(base_url=urls[dialect] + "/v1", api_key="none", max_retries=0)
    messages: Any = [{"role": "user", "content": "a question long enough to fill blocks " * 4}]
    reply = client.chat.completions.create(model="sim-model", messages=messages)
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    stream = client.chat.completions.create(
        model="sim-model",
        messages=messages,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content[:16]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0, "same prompt, now cached"


def test_health_per_dialect(urls: dict[str, str]) -> None:
    assert get(urls["vllm"] + "/health")[0] == 200
    assert get(urls["sglang"] + "/health")[0] == 200
    assert json.loads(get(urls["llamacpp"] + "/health")[1]) == {"status": "ok"}
