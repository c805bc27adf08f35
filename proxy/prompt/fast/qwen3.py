"""Qwen3 (``builtin/qwen3.jinja``): Qwen2.5's tool block without a default system prompt,
and reasoning: an assistant turn after the last real user query keeps its reasoning in a
``<think>`` block (the last turn always does); earlier turns lose it, whether it came as
``reasoning_content`` or inline ``<think>...</think>``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from proxy.prompt.fast.common import Unsupported, text, tojson
from proxy.prompt.fast.qwen2_5 import TOOLS_HEAD, TOOLS_TAIL, checked_tools, tool_lines


def render(
    messages: Sequence[Any],
    tools: Any,
    add_generation_prompt: Any,
    today: date | None,
    **kwargs: Any,
) -> str:
    """Reads ``enable_thinking``; a ``namespace`` variable would shadow the template's own
    ``namespace()``, so that is left to the template."""
    if "namespace" in kwargs:
        raise Unsupported
    tools = checked_tools(tools)
    if type(messages) is not list or not messages:
        raise Unsupported
    contents = _contents(messages)
    has_system = messages[0]["role"] == "system"
    if tools:
        system = f"{contents[0]}\n\n" if has_system else ""
        out = [f"<|im_start|>system\n{system}{TOOLS_HEAD}", tool_lines(tools), TOOLS_TAIL]
    else:
        out = [f"<|im_start|>system\n{contents[0]}<|im_end|>\n"] if has_system else []
    append = out.append
    last = len(messages) - 1
    last_query = _last_query_index(messages, contents)
    in_results = False  # inside a run of tool messages (one user turn)
    for index, message in enumerate(messages):
        role = message["role"]
        content = contents[index]
        if role == "tool":
            append(
                f"\n<tool_response>\n{content}\n</tool_response>"
                if in_results
                else f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response>"
            )
            in_results = True
            continue
        if in_results:
            append("<|im_end|>\n")
            in_results = False
        if role == "assistant":
            append(_assistant(message, content, index > last_query, index == last))
        elif role == "user" or (role == "system" and index):
            append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role != "system":
            raise Unsupported
    if in_results:
        append("<|im_end|>\n")
    if add_generation_prompt:
        append("<|im_start|>assistant\n")
        if kwargs.get("enable_thinking", True) is False:
            append("<think>\n\n</think>\n\n")
    return "".join(out)


def _contents(messages: list[Any]) -> list[str]:
    """Every message's content as text; messages must be dicts with a known role."""
    out = []
    for message in messages:
        if type(message) is not dict:
            raise Unsupported
        content = message.get("content")
        if type(message.get("role")) is not str:
            raise Unsupported
        out.append(content if type(content) is str else text(content))
    return out


def _last_query_index(messages: list[Any], contents: list[str]) -> int:
    """The last user message that is not a wrapped tool response (else the last message)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "user":
            content = contents[index]
            if not (content.startswith("<tool_response>") and content.endswith("</tool_response>")):
                return index
    return len(messages) - 1


def _assistant(message: dict[str, Any], content: str, after_query: bool, last: bool) -> str:
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
    elif type(reasoning) is not str:
        raise Unsupported
    if after_query and (last or reasoning):
        head = (
            "<|im_start|>assistant\n<think>\n"
            + reasoning.strip("\n")
            + "\n</think>\n\n"
            + content.lstrip("\n")
        )
    else:
        head = "<|im_start|>assistant\n" + content
    calls = message.get("tool_calls")
    if not calls:
        return head + "<|im_end|>\n"
    if type(calls) is not list:
        raise Unsupported
    out = [head]
    for position, call in enumerate(calls):
        if type(call) is not dict:
            raise Unsupported
        function = call.get("function") or call  # `{% if tool_call.function %}`
        if type(function) is not dict or "arguments" not in function:
            raise Unsupported
        name = function.get("name")
        arguments = function["arguments"]
        if type(name) is not str:
            raise Unsupported
        if type(arguments) is not str:
            if isinstance(arguments, str):  # printed by str(), not worth modelling
                raise Unsupported
            arguments = tojson(arguments)
        newline = "\n" if position or content else ""
        call_json = f'{{"name": "{name}", "arguments": {arguments}}}'
        out.append(f"{newline}<tool_call>\n{call_json}\n</tool_call>")
    out.append("<|im_end|>\n")
    return "".join(out)
