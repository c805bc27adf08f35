"""Routing text per endpoint: chat, Responses, Anthropic messages, completions, embeddings;
malformed bodies give one clear error type naming the field."""

from __future__ import annotations

import base64
import json
from datetime import date
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.prompt import PromptConfig, PromptError, TemplateRegistry, block_hashes, routing_text

DAY = date(2025, 3, 4)
QWEN = "Qwen/Qwen2.5-7B-Instruct"
REGISTRY = TemplateRegistry(PromptConfig())


def chat_key(body: dict[str, Any], registry: TemplateRegistry = REGISTRY) -> str | None:
    return routing_text("chat", body, registry, DAY)


# --- chat ---------------------------------------------------------------------------------


def test_chat_key_is_the_rendered_conversation_without_generation_prompt() -> None:
    body = {"model": "chatml", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    assert chat_key(body) == "<|im_start|>user\nHi<|im_end|>\n"


def test_chat_template_kwargs_reach_the_template_but_cannot_override_the_key() -> None:
    registry = TemplateRegistry(PromptConfig())
    registry.set_backend_template(
        "m", "{{ flavor }}|{{ add_generation_prompt }}|{{ messages|length }}"
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    kwargs = {"flavor": "spicy", "add_generation_prompt": True, "messages": []}
    assert chat_key({**body, "chat_template_kwargs": kwargs}, registry) == "spicy|False|1"


def test_text_parts_are_joined_and_images_become_url_hashed_placeholders() -> None:
    def body(url: str) -> dict[str, Any]:
        parts = [
            {"type": "text", "text": "What is in"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        return {"model": "chatml", "messages": [{"role": "user", "content": parts}]}

    cat, dog = chat_key(body("http://x/cat.png")), chat_key(body("http://x/dog.png"))
    assert cat.startswith("<|im_start|>user\nWhat is in\n<image:")
    assert cat != dog
    assert cat == chat_key(body("http://x/cat.png"))


def test_null_content_and_string_arguments_are_normalised_like_vllm() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    key = chat_key({"model": QWEN, "messages": messages})
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}' in key
    calls[0]["function"]["arguments"] = "{not json"
    assert '"arguments": "{not json"' in chat_key({"model": QWEN, "messages": messages})


def test_template_errors_fall_back_and_are_counted() -> None:
    registry = TemplateRegistry(PromptConfig())
    registry.set_backend_template("strict", "{{ raise_exception('no') }}")
    body = {"model": "strict", "messages": [{"role": "user", "content": "x"}]}
    assert chat_key(body, registry) == "<|user|>\nx\n"
    assert chat_key(body, registry) == "<|user|>\nx\n"
    assert registry.template_errors == {"backend:strict": 2}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "request body"),
        ({"model": "m"}, "messages must be a non-empty list"),
        ({"model": "m", "messages": []}, "messages must be a non-empty list"),
        ({"model": 3, "messages": [{"role": "user"}]}, "model must be a string"),
        ({"messages": ["hi"]}, r"messages\[0\] must be an object"),
        ({"messages": [{"role": "user"}, {"content": "x"}]}, r"messages\[1\]\.role"),
        ({"messages": [{"role": "user", "content": 5}]}, r"messages\[0\]\.content must be"),
        ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, r"content\[0\]\.type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            r"content\[0\]\.text",
        ),
        ({"messages": [{"role": "assistant", "tool_calls": {}}]}, r"messages\[0\]\.tool_calls"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
            r"tool_calls\[0\]\.function\.name",
        ),
        ({"messages": [{"role": "user"}], "tools": [1]}, "tools must be a list of objects"),
        ({"messages": [{"role": "user"}], "chat_template_kwargs": []}, "chat_template_kwargs"),
    ],
)
def test_malformed_chat_bodies_name_the_field(body: Any, field: str) -> None:
    with pytest.raises(PromptError, match=field):
        chat_key(body)


# --- the same conversation through every endpoint ------------------------------------------

TOOL_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def as_chat() -> dict[str, Any]:
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "read_file", "arguments": '{"path": "a.py"}'}
    return {
        "model": QWEN,
        "tools": [
            {
                "type": "function",
                "function": {"name": "read_file", "description": "Read", "parameters": TOOL_SCHEMA},
            }
        ],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Open a.py"},
            {"role": "assistant", "content": "Opening.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"},
        ],
    }


def as_responses() -> dict[str, Any]:
    return {
        "model": QWEN,
        "instructions": "Be brief.",
        "tools": [
            {
                "type": "function",
                "name": "read_file",
                "description": "Read",
                "parameters": TOOL_SCHEMA,
            },
            {"type": "web_search"},
        ],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Open a.py"}]},
            {"type": "reasoning", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Opening."}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "read_file",
                "arguments": '{"path": "a.py"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "x = 1"},
        ],
    }


def as_anthropic() -> dict[str, Any]:
    return {
        "model": QWEN,
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "read_file", "description": "Read", "input_schema": TOOL_SCHEMA}],
        "messages": [
            {"role": "user", "content": "Open a.py"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Opening."},
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "read_file",
                        "input": {"path": "a.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "x = 1"}],
            },
        ],
    }


def test_chat_responses_and_anthropic_bodies_of_one_conversation_share_the_key() -> None:
    chat = routing_text("chat", as_chat(), REGISTRY, DAY)
    assert routing_text("responses", as_responses(), REGISTRY, DAY) == chat
    assert routing_text("messages", as_anthropic(), REGISTRY, DAY) == chat
    assert '"name": "read_file"' in chat and "<tool_response>\nx = 1\n</tool_response>" in chat


def test_responses_string_input_and_consecutive_function_calls() -> None:
    assert routing_text("responses", {"model": "chatml", "input": "Hi"}, REGISTRY) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
    ]
    key = routing_text("responses", {"model": QWEN, "input": items}, REGISTRY)
    assert key.count("<|im_start|>assistant") == 1 and key.count("<tool_call>") == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": 5}, "input must be a string or a list"),
        ({"input": []}, "input must not be empty"),
        ({"input": "x", "instructions": ["x"]}, "instructions must be a string"),
        ({"input": [1]}, r"input\[0\] must be an object"),
        ({"input": [{"type": "message", "content": "x"}]}, r"input\[0\]\.role"),
        ({"input": [{"type": "function_call", "name": "f"}]}, r"input\[0\]\.call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "a", "output": 3}]}, r"\.output"),
    ],
)
def test_malformed_responses_bodies_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(PromptError, match=field):
        routing_text("responses", body, REGISTRY)


def test_anthropic_thinking_becomes_reasoning_and_images_placeholders() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
    body = {
        "model": "Qwen3-8B",
        "messages": [
            {"role": "user", "content": [image, {"type": "text", "text": "Describe, then tool."}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Need the tool.", "signature": "s"},
                    {"type": "redacted_thinking", "data": "zzz"},
                    {"type": "tool_use", "id": "t1", "name": "zoom", "input": {"x": 1}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    }
    key = routing_text("messages", body, REGISTRY)
    assert key.startswith("<|im_start|>user\n<image:")
    assert "<think>\nNeed the tool.\n</think>" in key
    assert "zzz" not in key


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": "hi"}, "messages must be a non-empty list"),
        ({"messages": [{"content": "x"}]}, r"messages\[0\]\.role"),
        ({"system": 5, "messages": [{"role": "user", "content": "x"}]}, "system must be"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            r"messages\[0\]\.content\[0\]\.tool_use_id",
        ),
        ({"messages": [{"role": "user", "content": [7]}]}, r"content\[0\] must be an object"),
    ],
)
def test_malformed_anthropic_bodies_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(PromptError, match=field):
        routing_text("messages", body, REGISTRY)


# --- completions and load-only endpoints ---------------------------------------------------


def test_completion_prompts() -> None:
    assert routing_text("completions", {"prompt": "Once upon"}, REGISTRY) == "Once upon"
    assert routing_text("completions", {"prompt": ["shared few-shot A", "B"]}, REGISTRY) == (
        "shared few-shot A"
    )


def test_token_ids_are_four_characters_each_and_extend_their_prefix() -> None:
    ids = list(range(70_000, 70_064))
    text = routing_text("completions", {"prompt": ids}, REGISTRY)
    assert len(text) == 4 * len(ids)
    longer = routing_text("completions", {"prompt": [*ids, 5, 6, 7]}, REGISTRY)
    assert longer.startswith(text)
    assert routing_text("completions", {"prompt": [ids, [1]]}, REGISTRY) == text
    raw = base64.b64decode(text)
    assert int.from_bytes(raw[3:6], "little") == ids[1]
    assert len(block_hashes(text, 128, 8192)) == 2  # 64 tokens = two 32-token blocks


@pytest.mark.parametrize(
    "prompt", [None, [], [1.5], [-1], [1 << 24], ["a", 1], [[1], 2], {"a": 1}, 5]
)
def test_malformed_completion_prompts_are_prompt_errors(prompt: Any) -> None:
    with pytest.raises(PromptError, match="prompt"):
        routing_text("completions", {"prompt": prompt}, REGISTRY)


def test_embeddings_and_other_endpoints_route_by_load_only() -> None:
    assert routing_text("embeddings", {"input": "x"}, REGISTRY) is None
    assert routing_text("other", "garbage", REGISTRY) is None
    with pytest.raises(ValueError, match="unknown endpoint"):
        routing_text("audio", {}, REGISTRY)


# --- garbage never raises anything but PromptError -----------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
KEYS = [
    "role", "content", "type", "text", "tool_calls", "function", "name", "arguments", "id",
    "call_id", "output", "tool_use_id", "input", "thinking", "reasoning_content", "image_url",
    "tool_call_id", "source",
]  # fmt: skip
ROLES = st.sampled_from(["user", "assistant", "system", "tool", "model", "ipython"])
leaf = st.none() | st.text(max_size=8) | ROLES | st.integers(-2, 2) | st.booleans()
part = st.dictionaries(st.sampled_from(KEYS), leaf | st.lists(leaf, max_size=2), max_size=4)
value = leaf | part | st.lists(leaf | part, max_size=3)
shaped = st.dictionaries(st.sampled_from(KEYS), value, max_size=5) | value
MODEL_NAMES = st.sampled_from(["qwen3", "qwen2.5", "llama-3.2", "llama3", "mistral-nemo",
                               "mistral-small-3", "gemma-3", "chatml", "x", None, 7])  # fmt: skip
ENDPOINT_NAMES = st.sampled_from(["chat", "completions", "responses", "messages", "embeddings"])


def _check(endpoint: str, body: Any) -> None:
    try:
        text = routing_text(endpoint, body, REGISTRY, DAY)
    except PromptError:
        return
    assert text is None or isinstance(text, str)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(ENDPOINT_NAMES, json_values)
def test_arbitrary_json_raises_only_prompt_errors(endpoint: str, body: Any) -> None:
    _check(endpoint, body)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    ENDPOINT_NAMES,
    MODEL_NAMES,
    st.lists(shaped, max_size=5),
    shaped,
    st.sampled_from(["messages", "input", "prompt"]),
)
def test_request_shaped_garbage_raises_only_prompt_errors(
    endpoint: str, model: Any, items: list[Any], extra: Any, field: str
) -> None:
    body = {"model": model, field: items, "tools": extra, "system": extra, "instructions": extra}
    _check(endpoint, body)
    _check(endpoint, {"model": model, field: items})


def test_key_survives_a_json_round_trip() -> None:
    body = as_chat()
    assert chat_key(json.loads(json.dumps(body))) == chat_key(body)


text_part = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=12)})
image_part = st.fixed_dictionaries(
    {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": st.text(max_size=8)})}
)
arguments = st.text(max_size=12) | st.dictionaries(st.text(max_size=4), leaf, max_size=2)
tool_call = st.fixed_dictionaries(
    {
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=6)}, optional={"arguments": arguments}
        )
    },
    optional={"id": st.text(max_size=10), "type": st.just("function")},
)
plausible_message = st.fixed_dictionaries(
    {"role": ROLES},
    optional={
        "content": st.none() | st.text(max_size=20) | st.lists(text_part | image_part, max_size=3),
        "tool_calls": st.lists(tool_call, max_size=2),
        "tool_call_id": leaf,
        "reasoning_content": leaf,
        "name": leaf,
    },
)
plausible_tools = st.none() | st.lists(
    st.fixed_dictionaries({"type": st.just("function"), "function": part}), max_size=2
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    MODEL_NAMES.filter(lambda m: isinstance(m, str)),
    st.lists(plausible_message, min_size=1, max_size=6),
    plausible_tools,
)
def test_well_shaped_conversations_always_render(model: str, messages: list, tools: Any) -> None:
    """Whatever a template makes of a conversation (it may raise), a well-shaped request
    always gets a key: the generic rendering never fails."""
    text = routing_text("chat", {"model": model, "messages": messages, "tools": tools}, REGISTRY)
    assert isinstance(text, str)
