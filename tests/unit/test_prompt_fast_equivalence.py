"""Fast renderers against the Jinja templates they stand in for, by property: for every
generated conversation a fast renderer either returns exactly the text the template renders
in a plain Hugging Face style sandbox, or steps aside (``Unsupported``); it never returns
anything else, and for the conversations agents really send it never steps aside."""

from __future__ import annotations

import json
from datetime import date, datetime, time
from functools import cache
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from proxy.prompt import (
    ChatTemplate,
    PromptConfig,
    PromptError,
    TemplateRegistry,
    TemplateRenderError,
    routing_text,
)
from proxy.prompt.fast import Unsupported, fast_renderer
from proxy.prompt.messages import message as canonical_message
from proxy.prompt.messages import messages as canonical_messages
from proxy.prompt.messages import tools as canonical_tools
from proxy.prompt.templates import builtin_templates
from tests.unit.test_prompt_templates import MODELS

FAMILIES = ("chatml", "qwen2_5", "qwen3", "llama3", "llama3_2")
LLAMA = ("llama3", "llama3_2")

# --- the reference: a plain sandbox set up the way transformers sets it up ----------------


def _hf_tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _hf_raise(message: str) -> None:
    raise jinja2.TemplateError(message)


@cache
def _reference(name: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _hf_tojson
    env.globals["raise_exception"] = _hf_raise
    return env.from_string(builtin_templates()[name].source)


@cache
def _template(name: str) -> ChatTemplate:
    loaded = builtin_templates()[name]
    return ChatTemplate(name, loaded.source, loaded.bos_token, loaded.eos_token)


def reference(
    name: str, messages: Any, tools: Any, generation: bool, today: date, kwargs: dict[str, Any]
) -> str | None:
    """What the template renders (content parts joined by newlines first, as ChatTemplate
    does for these string-content templates), or None where it fails."""
    loaded = builtin_templates()[name]
    try:
        flat = [
            {**m, "content": "\n".join(part["text"] for part in m["content"])}
            if isinstance(m, dict) and isinstance(m.get("content"), list)
            else m
            for m in messages
        ]
        context = {
            "bos_token": loaded.bos_token,
            "eos_token": loaded.eos_token,
            **kwargs,
            "messages": flat,
            "tools": tools,
            "add_generation_prompt": generation,
            "strftime_now": lambda fmt: datetime.combine(today, time()).strftime(fmt),
        }
        return _reference(name).render(context)
    except Exception:
        return None


def fast(
    name: str,
    messages: Any,
    tools: Any,
    generation: Any,
    today: date,
    kwargs: dict[str, Any],
    request: bool = False,
) -> str | None:
    """The fast renderer's text (from canonical messages, or from messages as a request
    sent them), or None where it steps aside."""
    loaded = builtin_templates()[name]
    renderer = fast_renderer(loaded.source)
    assert renderer is not None
    render = renderer.render_request if request else renderer.render
    variables = {"bos_token": loaded.bos_token, "eos_token": loaded.eos_token, **kwargs}
    try:
        return render(messages, tools, generation, today, **variables)
    except Unsupported:
        return None


def check(
    name: str,
    messages: Any,
    tools: Any,
    generation: Any,
    today: date,
    kwargs: dict[str, Any],
    must_render: bool,
) -> None:
    """Canonical messages (what ChatTemplate.render takes): the fast text is the Jinja
    text, and ChatTemplate.render gives the Jinja text or fails where Jinja fails."""
    expected = reference(name, messages, tools, generation, today, kwargs)
    got = fast(name, messages, tools, generation, today, kwargs)
    if must_render:
        assert got is not None, "the fast renderer stepped aside from a common conversation"
    if got is not None:
        assert got == expected
    template = _template(name)
    if expected is None:
        with pytest.raises(TemplateRenderError):
            template.render(messages, tools, generation, today, **kwargs)
    else:
        assert template.render(messages, tools, generation, today, **kwargs) == expected


def check_request(
    name: str,
    raw: Any,
    tools: Any,
    generation: Any,
    today: date,
    kwargs: dict[str, Any],
    must_render: bool,
) -> None:
    """Messages as a request sent them: the fast text is the Jinja text of the normalized
    messages; where normalization rejects them, the fast renderer steps aside."""
    got = fast(name, raw, tools, generation, today, kwargs, request=True)
    try:
        messages = canonical_messages(raw)
    except PromptError:
        assert got is None, "the fast renderer took messages normalization rejects"
        return
    if must_render:
        assert got is not None, "the fast renderer stepped aside from a common request"
    if got is not None:
        assert got == reference(name, messages, tools, generation, today, kwargs)


# --- what conversations are made of ---------------------------------------------------------

AWKWARD = [
    "",
    " ",
    "\n",
    "\n\n  padded \t\n",
    "<think>\nweighing it\n</think>\n\nthe answer",
    "before</think>after",
    "</think>",
    "<think>",
    "\n<think>a</think>b</think>\nc",
    "<tool_response>\nresult\n</tool_response>",
    "<tool_response>",
    "</tool_response>",
    'a "quoted" \\ back\\slash',
    "tab\tbell\x07nul\x00esc\x1b del\x7f",
    "héllo ✓ 日本語 🙂",
    "\u2028line\u2029sep\xa0nbsp",
    '{"path": "a.py"}',
    '"a json string"',
    "<|im_start|>user\nfake<|im_end|>",
    "<|eot_id|>",
    "  <think>\n\nplan: read a.py\n\n</think>\n\n  I read it.\n",
    '<tool_response>\n{"ok": true}\n</tool_response>\n',
    'He said "hi"\n\tthen left\\n ✓',
]
TEXT = st.sampled_from(AWKWARD) | st.text(max_size=10)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats()
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=5,
)
JSON_OBJECT = st.dictionaries(TEXT, JSON, max_size=4)
ARGUMENTS = st.one_of(
    JSON_OBJECT.map(json.dumps),  # what OpenAI clients send
    JSON_OBJECT.map(lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False)),
    JSON_OBJECT,  # already an object
    st.sampled_from(["{not json", "", '"a json string"', "[1, 2]", "42", "null"]),
    JSON,
)
PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT),
    st.builds(
        lambda k, t: {"type": k, "text": t}, st.sampled_from(["input_text", "output_text"]), TEXT
    ),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, TEXT),
    st.just({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}),
)
CONTENT = TEXT | st.lists(PART, min_size=1, max_size=3)
TOOL = st.builds(
    lambda name, description, schema: {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    },
    TEXT,
    TEXT,
    st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(TEXT, JSON, max_size=3)}
    ),
)
TOOLS = st.none() | st.lists(TOOL, max_size=3)
DAYS = st.dates() | st.datetimes()


def call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CALL = st.builds(call, TEXT, ARGUMENTS, st.text(max_size=6))
# A call without its "function" wrapper (or with an empty one): templates differ on it.
FLAT_CALL = st.builds(
    lambda name, arguments, wrapper: {"name": name, "arguments": arguments, **wrapper},
    TEXT,
    ARGUMENTS,
    st.sampled_from([{}, {"function": None}, {"function": {}}]),
)


# Reasoning that is empty or only line breaks decides whether Qwen3 prints a think block.
REASONING = st.sampled_from(["", "\n", " ", "\n\nthought\n\n", "<think>x</think>"]) | TEXT


@st.composite
def assistant(draw: st.DrawFn, with_calls: bool = True) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    calls = draw(st.lists(CALL, max_size=3 if with_calls else 0))
    message["content"] = draw(st.none() | CONTENT) if calls else draw(CONTENT)
    if calls:
        message["tool_calls"] = calls
    if draw(st.booleans()):
        message["reasoning_content"] = draw(REASONING | st.none())
    return message


def simple(role: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda content: {"role": role, "content": content}, CONTENT)


RESULT = st.builds(
    lambda content: {"role": "tool", "tool_call_id": "c", "content": content}, CONTENT
)


@st.composite
def agent_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A request as agents and chat clients send it: an optional system prompt, a user
    message, then user turns, answers, and tool calls each followed by their results."""
    messages = [draw(simple("system"))] if draw(st.booleans()) else []
    messages.append(draw(simple("user")))
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["user", "answer", "calls"]))
        if kind == "user":
            messages.append(draw(simple("user")))
        elif kind == "answer":
            messages.append(draw(assistant(with_calls=False)))
        else:
            turn = draw(assistant())
            messages.append(turn)
            messages.extend(draw(RESULT) for _ in turn.get("tool_calls", ()))
    return messages


ROLES = ["system", "user", "assistant", "tool", "ipython", "developer", "", "User"]


ODD_CALL = st.one_of(
    CALL,
    FLAT_CALL,
    st.builds(lambda function: {"function": function}, JSON),
    st.builds(call, JSON, ARGUMENTS, st.just("c")),  # a name that is not a string
    st.builds(lambda name: {"function": {"name": name}}, TEXT),  # no arguments
    JSON,
)
BROKEN_PARTS = st.sampled_from([[{"type": "text"}], ["plain"], [{"text": 5}], [{"x": 1}]])


@st.composite
def odd_message(draw: st.DrawFn) -> Any:
    """A message with one thing a direct caller might get wrong (or a template might treat
    specially): an odd role, null or odd content, odd tool calls, odd reasoning."""
    message = dict(draw(st.one_of(simple("user"), simple("system"), RESULT, assistant())))
    change = draw(st.sampled_from(["role", "content", "calls", "call", "reasoning", "value"]))
    if change == "role":
        message["role"] = draw(st.sampled_from(ROLES) | st.none() | st.integers())
    elif change == "content":
        message["content"] = draw(st.none() | JSON | BROKEN_PARTS)
        if draw(st.booleans()):
            del message["content"]
    elif change == "calls":
        message["tool_calls"] = draw(st.sampled_from([None, [], {}, "", 0, False]) | JSON)
    elif change == "call":
        message["role"] = draw(st.sampled_from(["assistant", "assistant", "tool", "user"]))
        message["tool_calls"] = draw(st.lists(ODD_CALL, min_size=1, max_size=2))
    elif change == "reasoning":
        message["reasoning_content"] = draw(REASONING | st.none() | JSON)
    else:
        return draw(JSON)
    return message


@st.composite
def perturbed_conversation(draw: st.DrawFn) -> list[Any]:
    """An agent conversation, normalized or as sent, with one or two odd messages put in
    or swapped in: odd shapes next to everything a fast renderer does handle."""
    messages: list[Any] = draw(agent_conversation())
    if draw(st.booleans()):
        messages = canonical_messages(messages)
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.integers(0, len(messages)))
        if at < len(messages) and draw(st.booleans()):
            messages[at] = draw(odd_message())
        else:
            messages.insert(at, draw(odd_message()))
    return messages


COMMON_KWARGS = st.fixed_dictionaries(
    {},
    optional={
        "enable_thinking": st.booleans(),
        "date_string": TEXT,
        "tools_in_user_message": st.booleans(),
        "unrelated": JSON,
    },
)
ODD_KWARGS = st.fixed_dictionaries(
    {},
    optional={
        "enable_thinking": st.booleans() | st.none() | st.integers(0, 1),
        "date_string": TEXT | st.integers(),
        "tools_in_user_message": st.booleans() | st.none() | st.integers(0, 1),
        "custom_tools": st.lists(TOOL, max_size=1),
        "builtin_tools": st.just(["brave_search", "wolfram_alpha"]),
        "namespace": st.just(1),
        "raise_exception": st.just("not callable"),
        "bos_token": TEXT | st.none(),
        # names the templates assign before reading (Jinja still lists them as context reads)
        "content": TEXT,
        "reasoning_content": TEXT,
        "system_message": TEXT,
        "first_user_message": TEXT,
        "tool_call": JSON,
    },
)


def multiple_calls(messages: list[dict[str, Any]]) -> bool:
    """Whether a message makes several tool calls (the Llama templates refuse that)."""
    return any(len(m.get("tool_calls", ())) > 1 for m in messages)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=agent_conversation(),
    tools=TOOLS,
    generation=st.booleans(),
    today=DAYS,
    kwargs=COMMON_KWARGS,
)
def test_agent_conversations_render_exactly_and_never_step_aside(
    raw: list[dict[str, Any]], tools: Any, generation: bool, today: date, kwargs: Any
) -> None:
    """Requests as the proxy sees them (normalized by ``proxy.prompt.messages``), in every
    family; only the Llama templates refuse (raise on) several calls in one message."""
    messages = canonical_messages(raw)
    tools = canonical_tools(tools)
    registry = TemplateRegistry(PromptConfig())
    for name in FAMILIES:
        must_render = not (name in LLAMA and multiple_calls(messages))
        check(name, messages, tools, generation, today, kwargs, must_render)
        check_request(name, raw, tools, generation, today, kwargs, must_render)
        if must_render:
            body = {"model": MODELS[name], "messages": raw, "chat_template_kwargs": kwargs}
            key = routing_text("chat", {**body, "tools": tools}, registry, today)
            assert key == reference(name, messages, tools, False, today, kwargs)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=agent_conversation(),
    turn=assistant(),
    calls=st.lists(ODD_CALL, min_size=1, max_size=2),
    results=st.integers(0, 2),
    tools=TOOLS,
    generation=st.booleans(),
)
def test_odd_tool_calls_render_exactly_or_step_aside(
    raw: list[dict[str, Any]],
    turn: dict[str, Any],
    calls: list[Any],
    results: int,
    tools: Any,
    generation: bool,
) -> None:
    """Tool calls without the function wrapper, with an empty or null one, without
    arguments, with a name that is not a string, at the end of a valid conversation."""
    day = date(2025, 3, 4)
    results_turn = [{"role": "tool", "content": f"result {i}"} for i in range(results)]
    odd = {**turn, "tool_calls": calls}
    messages = [*canonical_messages(raw), {**odd, "content": odd["content"] or ""}, *results_turn]
    sent = [*raw, odd, *results_turn]
    for name in FAMILIES:
        check(name, messages, tools, generation, day, {}, must_render=False)
        check_request(name, sent, tools, generation, day, {}, must_render=False)


@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=perturbed_conversation() | JSON,
    tools=TOOLS,
    generation=st.booleans(),
    today=DAYS,
    kwargs=COMMON_KWARGS,
)
def test_odd_messages_render_exactly_or_step_aside(
    messages: Any, tools: Any, generation: bool, today: date, kwargs: Any
) -> None:
    """Anything a caller might hand ``ChatTemplate.render`` or a client might send: same
    text or same failure."""
    for name in FAMILIES:
        check(name, messages, tools, generation, today, kwargs, must_render=False)
        check_request(name, messages, tools, generation, today, kwargs, must_render=False)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=agent_conversation(),
    tools=TOOLS | JSON,
    generation=st.booleans() | JSON,
    today=DAYS,
    kwargs=ODD_KWARGS,
)
def test_odd_variables_render_exactly_or_step_aside(
    raw: list[dict[str, Any]], tools: Any, generation: Any, today: date, kwargs: Any
) -> None:
    """Template variables a fast renderer does not model, of odd types, or that shadow the
    template's own names; tool lists and generation flags that are not what they should be."""
    messages = canonical_messages(raw)
    for name in FAMILIES:
        check(name, messages, tools, generation, today, kwargs, must_render=False)
        check_request(name, raw, tools, generation, today, kwargs, must_render=False)


@settings(max_examples=100, deadline=None)
@given(raw=st.lists(st.one_of(simple("user"), simple("system"), RESULT, assistant()), max_size=8))
def test_normalization_passes_canonical_messages_through_unchanged(raw: list[Any]) -> None:
    """The shortcut for messages already in canonical form gives what the full check gives."""
    if raw:
        assert canonical_messages(raw) == [canonical_message(m, "m") for m in raw]


# Edges the templates treat specially, pinned (the properties above find them by chance).
ALL = frozenset(FAMILIES)
EDGE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d ✓",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
# what, messages, template variables, and the families that must render them as a request
# sent them and as given to ChatTemplate.render
EDGES: list[tuple[str, list[Any], dict[str, Any], frozenset[str], frozenset[str]]] = [
    (
        "a call without the function wrapper beside an empty or null one",
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"name": "f", "arguments": {"a": 1}, "function": None},
                    {"name": "g", "arguments": "{}", "function": {}},
                ],
            },
        ],
        {},
        frozenset(),
        frozenset({"chatml", "qwen3"}),
    ),
    (
        "a call without the function wrapper at all",
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "x",
                "tool_calls": [{"name": "f", "arguments": {"a": [1, 2.5, None]}}],
            },
        ],
        {},
        frozenset(),
        frozenset({"chatml", "qwen2_5", "qwen3"}),
    ),
    (
        "tool calls that are empty but not a list",
        [
            {"role": "user", "content": "go", "tool_calls": {}},
            {"role": "assistant", "content": "ok", "tool_calls": ""},
        ],
        {},
        frozenset(),
        frozenset({"chatml", "qwen2_5", "qwen3"}),
    ),
    (
        "reasoning of only line breaks after the last query, then a tool result",
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "\n\nx",
                "reasoning_content": "\n \n",
                "tool_calls": [
                    {
                        "id": "1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"q": "\\"hi\\""}'},
                    }
                ],
            },
            {"role": "tool", "content": 'line\n"quoted"\t\\ ✓ 🙂'},
        ],
        {"enable_thinking": False},
        ALL,
        ALL,
    ),
    (
        "arguments that are a JSON string, invalid JSON, or missing",
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '"{\\"a\\": 1}"'},
                    }
                ],
            },
            {"role": "tool", "content": "r1"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "2", "type": "function", "function": {"name": "g", "arguments": "{oops"}}
                ],
            },
            {"role": "tool", "content": "r2"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "3", "type": "function", "function": {"name": "h"}}],
            },
        ],
        {"date_string": "01 Jan 2030"},
        ALL,
        frozenset(),
    ),
    (
        "a user message that only wraps tool responses is not the last query",
        [
            {"role": "system", "content": "  sys  "},
            {"role": "user", "content": "real question"},
            {
                "role": "assistant",
                "content": "<think>\nplan\n</think>\n\ncall",
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "user", "content": "<tool_response>\nout\n</tool_response>"},
            {"role": "assistant", "content": "<think>more</think>done"},
        ],
        {"tools_in_user_message": False},
        ALL,
        ALL,
    ),
]


@pytest.mark.parametrize(
    ("what", "raw", "kwargs", "sent", "given"), EDGES, ids=[e[0] for e in EDGES]
)
@pytest.mark.parametrize("tools", [None, [], EDGE_TOOLS])
def test_known_edges_render_exactly_or_step_aside(
    what: str,
    raw: list[Any],
    kwargs: dict[str, Any],
    sent: frozenset[str],
    given: frozenset[str],
    tools: Any,
) -> None:
    """Each edge as sent, as given to ChatTemplate.render directly, and normalized."""
    day = date(2025, 3, 4)
    for name in FAMILIES:
        for generation in (False, True):
            check_request(name, raw, tools, generation, day, kwargs, must_render=name in sent)
            check(name, raw, tools, generation, day, kwargs, must_render=name in given)
            try:
                messages = canonical_messages(raw)
            except PromptError:
                continue
            check(name, messages, tools, generation, day, kwargs, must_render=False)
