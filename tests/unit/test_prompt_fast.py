"""Fast renderers: which templates get one, that requests really render through them (long
agent conversations included, byte-identical to Jinja), and that the routing keys of
growing conversations still extend each other on the fast path."""

from __future__ import annotations

import json
from datetime import date
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from jinja2 import Environment, meta

from proxy.prompt import ChatTemplate, PromptConfig, TemplateRegistry, routing_text
from proxy.prompt.fast import chatml, fast_renderer, llama3, qwen2_5, qwen3
from proxy.prompt.messages import messages as canonical_messages
from proxy.prompt.templates import builtin_templates
from tests.unit.test_prompt_templates import MODELS, TOOLS, agent_turns, chat_turns

ENGINES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "engines"
DAY = date(2025, 3, 4)
RENDERERS = {
    "chatml": chatml.RENDERER,
    "qwen2_5": qwen2_5.RENDERER,
    "qwen3": qwen3.RENDERER,
    "llama3": llama3.RENDERER_3_1,
    "llama3_2": llama3.RENDERER_3_2,
}


def jinja_only(name: str) -> ChatTemplate:
    """The built-in with a comment appended: same Jinja template, no fast renderer."""
    loaded = builtin_templates()[name]
    template = ChatTemplate(name, loaded.source + "{# jinja #}", loaded.bos_token, loaded.eos_token)
    assert template.fast is None
    return template


def builtin(name: str) -> ChatTemplate:
    loaded = builtin_templates()[name]
    return ChatTemplate(name, loaded.source, loaded.bos_token, loaded.eos_token)


@pytest.mark.parametrize(("name", "render"), RENDERERS.items())
def test_each_family_is_registered_to_its_builtin_text(name: str, render: Any) -> None:
    """Fails when a built-in template file changes: check its fast renderer still matches
    it, then update the SHA-256 in ``proxy.prompt.fast``."""
    assert fast_renderer(builtin_templates()[name].source) is render
    assert builtin(name).fast is render


@pytest.mark.parametrize("name", ["mistral_nemo", "mistral_small_3", "gemma", "fallback"])
def test_other_templates_render_through_jinja(name: str) -> None:
    assert fast_renderer(builtin_templates()[name].source) is None


def test_same_compiled_text_gets_the_fast_renderer_and_an_edit_does_not() -> None:
    """Jinja drops one trailing line break and reads CRLF and CR as LF: such variants are
    the same template. Anything else, even a space, is a different template."""
    source = builtin_templates()["qwen2_5"].source
    assert source.endswith("\n")
    for variant in (source[:-1], source.replace("\n", "\r\n"), source.replace("\n", "\r")):
        assert fast_renderer(variant) is qwen2_5.RENDERER
    for edited in (source + "\n", source.replace("Alibaba", "alibaba"), " " + source):
        assert fast_renderer(edited) is None


@pytest.mark.skipif(not ENGINES.is_dir(), reason="shared/fixtures not present")
def test_the_template_llama_cpp_reports_gets_the_chatml_renderer() -> None:
    raw = (ENGINES / "llama-server-lcp0.3.36" / "props.json").read_text()
    props = json.loads(raw[: raw.rindex("}") + 1])
    registry = TemplateRegistry(PromptConfig())
    registry.set_backend_template("tiny", props["chat_template"], props["bos_token"])
    assert registry.template_for("tiny").fast is chatml.RENDERER


# Every name each template reads from its context (besides messages, tools and
# add_generation_prompt): the fast renderer models it, refuses it (Unsupported), or the
# template assigns it before reading it (Jinja's analysis lists those too); Llama calls
# raise_exception only where the fast renderer steps aside anyway. Globals are not listed:
# Qwen3's namespace, which a variable would shadow, is refused. The property tests pass
# all of these as template variables.
TEMPLATE_READS = {
    "chatml": set(),
    "qwen2_5": set(),
    "qwen3": {"enable_thinking", "content", "reasoning_content"},
    "llama3": {
        "bos_token",
        "builtin_tools",
        "custom_tools",
        "date_string",
        "raise_exception",
        "tools_in_user_message",
        "first_user_message",
        "system_message",
        "tool_call",
    },
    "llama3_2": {
        "bos_token",
        "custom_tools",
        "date_string",
        "raise_exception",
        "strftime_now",
        "tools_in_user_message",
        "first_user_message",
        "system_message",
        "tool_call",
    },
}


@pytest.mark.parametrize("name", RENDERERS)
def test_the_variables_each_template_reads_are_the_modelled_ones(name: str) -> None:
    parsed = Environment(extensions=["jinja2.ext.loopcontrols"]).parse(
        builtin_templates()[name].source
    )
    reads = meta.find_undeclared_variables(parsed)
    assert reads - {"messages", "tools", "add_generation_prompt"} == TEMPLATE_READS[name]


def long_agent_conversation(steps: int) -> list[dict[str, Any]]:
    """A long tool-using session, as an agent resends it: system prompt, task, then tool
    calls, results (multi-line, quoted, non-ASCII), progress notes and new instructions."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent.\nUse the tools. ✓"},
        {"role": "user", "content": "Fix the failing tests in src/."},
    ]
    for step in range(steps):
        call_id = f"call_{step}"
        arguments = json.dumps({"path": f"src/mödule_{step}.py", "lines": [1, step]})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": f"Step {step}: look at the next module.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": arguments},
                    }
                ],
            }
        )
        output = f'def f_{step}():\n    return "value\\t{step}"  # ünïcode\n'
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        if step % 7 == 6:
            messages.append({"role": "assistant", "content": f"  Progress after {step}.\n"})
            messages.append({"role": "user", "content": [{"type": "text", "text": "Go on."}]})
    return messages


@pytest.mark.parametrize("name", RENDERERS)
@pytest.mark.parametrize("generation", [False, True])
def test_long_agent_conversations_render_byte_identically(name: str, generation: bool) -> None:
    messages = canonical_messages(long_agent_conversation(300))
    fast = builtin(name)
    loaded = builtin_templates()[name]
    variables = {"bos_token": loaded.bos_token, "eos_token": loaded.eos_token}
    text = fast.fast.render(messages, TOOLS, generation, DAY, **variables)  # no step aside
    assert text == jinja_only(name).render(messages, TOOLS, generation, DAY)
    assert fast.render(messages, TOOLS, generation, DAY) == text
    raw = long_agent_conversation(300)
    assert fast.fast.render_request(raw, TOOLS, generation, DAY, **variables) == text


@pytest.mark.parametrize("name", RENDERERS)
def test_prefix_stability_holds_on_the_fast_path(name: str) -> None:
    """The existing prefix-stability conversations, rendered by the fast renderer itself
    (so none of them quietly went through Jinja), from the requests as sent and from their
    normalized messages: same keys as Jinja, each turn's key a
    prefix of the next one's (Qwen3 drops earlier reasoning once the user speaks again,
    as the engine does: that turn is checked in test_prompt_templates)."""
    fast = builtin(name)
    loaded = builtin_templates()[name]
    variables = {"bos_token": loaded.bos_token, "eos_token": loaded.eos_token}
    conversations = [
        (chat_turns(system=True), None),
        (chat_turns(system=False), None),
        (agent_turns(["call_1", "call_2", "call_3"]), TOOLS),
        (agent_turns(["c1", "c2", "c3"], reasoning=True, system=False), TOOLS),
    ]
    for turns, tools in conversations:
        keys = []
        for turn in turns:
            messages = canonical_messages(turn)
            key = fast.fast.render_request(turn, tools, False, DAY, **variables)
            assert key == fast.fast.render(messages, tools, False, DAY, **variables)
            assert key == jinja_only(name).render(messages, tools, False, DAY)
            keys.append(key)
        for i, (before, after) in enumerate(pairwise(keys)):
            dropped_reasoning = name == "qwen3" and "<think>" in before and i == 2
            assert dropped_reasoning or after.startswith(before), (name, i)


@pytest.mark.parametrize(("name", "render"), RENDERERS.items())
def test_requests_for_builtin_models_use_the_fast_renderer(name: str, render: Any) -> None:
    registry = TemplateRegistry(PromptConfig())
    assert registry.template_for(MODELS[name]).fast is render
    turn = agent_turns(["call_1", "call_2", "call_3"])[-1]
    body = {"model": MODELS[name], "messages": turn, "tools": TOOLS}
    assert routing_text("chat", body, registry, DAY) == jinja_only(name).render(
        canonical_messages(turn), TOOLS, False, DAY
    )
