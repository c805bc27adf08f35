"""Qwen2.5 (``builtin/qwen2_5.jinja``): ChatML with a default system prompt, the tool list
as JSON lines in the system message, tool calls as ``<tool_call>`` JSON and consecutive
tool results merged into one user turn of ``<tool_response>`` blocks. The template reads
nothing but the messages, the tools and ``add_generation_prompt``."""

from __future__ import annotations

from typing import Any

from proxy.prompt.fast.common import (
    FastRenderer,
    Unsupported,
    arguments_json,
    check_request_calls,
    request_function,
    request_text,
    text,
    tojson,
    validate_request_calls,
)

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def tool_lines(tools: list[Any]) -> str:
    """The ``<tools>`` body: one JSON line per tool (Qwen2.5 and Qwen3 alike)."""
    return "".join(["\n" + tojson(tool) for tool in tools])


def checked_tools(tools: Any) -> list[Any]:
    """The tool list, or [] for none; other shapes are left to the template."""
    if tools is None:
        return []
    if type(tools) is not list:
        raise Unsupported
    return tools


def render(messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **_: Any) -> str:
    return _render(messages, tools, add_generation_prompt, request=False)


def render_request(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **_: Any
) -> str:
    return _render(messages, tools, add_generation_prompt, request=True)


RENDERER = FastRenderer(render, render_request)


def _render(messages: Any, tools: Any, add_generation_prompt: Any, request: bool) -> str:
    tools = checked_tools(tools)
    if type(messages) is not list or not messages or type(messages[0]) is not dict:
        raise Unsupported
    read = request_text if request else text
    has_system = messages[0].get("role") == "system"
    system = read(messages[0].get("content")) if has_system else DEFAULT_SYSTEM
    if tools:
        out = [f"<|im_start|>system\n{system}\n\n{TOOLS_HEAD}", tool_lines(tools), TOOLS_TAIL]
    else:
        out = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    append = out.append
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
            if calls:
                _assistant_calls(append, content, calls, request)
            else:
                append(f"<|im_start|>assistant\n{content}<|im_end|>\n")
        elif role == "user" or (role == "system" and index):
            append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role != "system":
            raise Unsupported
    if in_results:
        append("<|im_end|>\n")
    if add_generation_prompt:
        append("<|im_start|>assistant\n")
    return "".join(out)


def _assistant_calls(append: Any, content: str, calls: Any, request: bool) -> None:
    if type(calls) is not list:
        raise Unsupported
    append("<|im_start|>assistant\n" + content if content else "<|im_start|>assistant")
    for call in calls:
        if request:
            function = request_function(call)
            arguments = arguments_json(function.get("arguments"))
        else:
            function = call.get("function", call) if type(call) is dict else None
            if type(function) is not dict or "arguments" not in function:
                raise Unsupported  # `tool_call.function is defined`, then its arguments
            arguments = tojson(function["arguments"])
        name = function.get("name")
        if type(name) is not str:
            raise Unsupported
        append(f'\n<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>')
    append("<|im_end|>\n")
