"""Qwen3 (``builtin/qwen3.jinja``): Qwen2.5's tool block without a default system prompt,
and reasoning: an assistant turn after the last real user query keeps its reasoning in a
``<think>`` block (the last turn always does); earlier turns lose it, whether it came as
``reasoning_content`` or inline ``<think>...</think>``. Reads ``enable_thinking``; a
``namespace`` variable would shadow the template's own ``namespace()``, so that is left to
the template."""

from __future__ import annotations

from typing import Any

from proxy.prompt.fast.common import (
    FastRenderer,
    Unsupported,
    arguments_text,
    check_request_calls,
    request_function,
    request_text,
    text,
    tojson,
    validate_request_calls,
)
from proxy.prompt.fast.qwen2_5 import TOOLS_HEAD, TOOLS_TAIL, checked_tools, tool_lines


def render(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **variables: Any
) -> str:
    return _render(messages, tools, add_generation_prompt, variables, request=False)


def render_request(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **variables: Any
) -> str:
    return _render(messages, tools, add_generation_prompt, variables, request=True)


RENDERER = FastRenderer(render, render_request)


def _render(
    messages: Any, tools: Any, add_generation_prompt: Any, variables: dict[str, Any], request: bool
) -> str:
    if "namespace" in variables:
        raise Unsupported
    tools = checked_tools(tools)
    if type(messages) is not list or not messages or type(messages[0]) is not dict:
        raise Unsupported
    read = request_text if request else text
    if messages[0].get("role") == "system":
        system = read(messages[0].get("content"))
        if tools:
            out = [f"<|im_start|>system\n{system}\n\n{TOOLS_HEAD}", tool_lines(tools), TOOLS_TAIL]
        else:
            out = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    else:
        out = [f"<|im_start|>system\n{TOOLS_HEAD}", tool_lines(tools), TOOLS_TAIL] if tools else []
    append = out.append
    last = len(messages) - 1
    last_query = _last_query_index(messages, read)
    in_results = False  # inside a run of tool messages (one user turn)
    for index, message in enumerate(messages):
        if type(message) is not dict:
            raise Unsupported
        role = message.get("role")
        content = message.get("content")
        if type(content) is not str:
            content = read(content)
        calls = message.get("tool_calls")
        if calls is not None and request and check_request_calls(calls) and role != "assistant":
            validate_request_calls(calls)
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
            _assistant(append, message, content, index > last_query, index == last, request)
        elif role == "user" or (role == "system" and index):
            append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role != "system":
            raise Unsupported
    if in_results:
        append("<|im_end|>\n")
    if add_generation_prompt:
        append("<|im_start|>assistant\n")
        if variables.get("enable_thinking", True) is False:
            append("<think>\n\n</think>\n\n")
    return "".join(out)


def _last_query_index(messages: list[Any], read: Any) -> int:
    """The last user message that is not a wrapped tool response (else the last message);
    messages it cannot read are left for the main loop to refuse."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if type(message) is dict and message.get("role") == "user":
            content = message.get("content")
            if type(content) is not str:
                content = read(content)
            if not (content.startswith("<tool_response>") and content.endswith("</tool_response>")):
                return index
    return len(messages) - 1


def _assistant(
    append: Any,
    message: dict[str, Any],
    content: str,
    after_query: bool,
    last: bool,
    request: bool,
) -> None:
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
    elif type(reasoning) is not str:
        raise Unsupported
    if after_query and (last or reasoning):
        append(
            "<|im_start|>assistant\n<think>\n"
            + reasoning.strip("\n")
            + "\n</think>\n\n"
            + content.lstrip("\n")
        )
    else:
        append("<|im_start|>assistant\n" + content)
    calls = message.get("tool_calls")
    if calls:
        if type(calls) is not list:
            raise Unsupported
        for position, call in enumerate(calls):
            if request:
                function = request_function(call)
                arguments = arguments_text(function.get("arguments"))
            else:
                function = _canonical_function(call)
                arguments = function["arguments"]
                if type(arguments) is not str:
                    if isinstance(arguments, str):  # printed by str(), not worth modelling
                        raise Unsupported
                    arguments = tojson(arguments)
            name = function.get("name")
            if type(name) is not str:
                raise Unsupported
            newline = "\n" if position or content else ""
            call_json = f'{{"name": "{name}", "arguments": {arguments}}}'
            append(f"{newline}<tool_call>\n{call_json}\n</tool_call>")
    append("<|im_end|>\n")


def _canonical_function(call: Any) -> dict[str, Any]:
    """``{% if tool_call.function %}{% set tool_call = tool_call.function %}{% endif %}``,
    where the result has arguments to print."""
    if type(call) is not dict:
        raise Unsupported
    function = call.get("function") or call
    if type(function) is not dict or "arguments" not in function:
        raise Unsupported
    return function
