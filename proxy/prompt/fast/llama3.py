"""Llama 3.1/3.3 (``builtin/llama3.jinja``) and Llama 3.2 (``builtin/llama3_2.jinja``):
a system header with the date line, the tool list as indented JSON in the first user
message (or in the system message with ``tools_in_user_message=False``), one tool call per
assistant turn as ``{"name": ..., "parameters": ...}`` and tool results in ``ipython`` turns,
printed as JSON strings (the template's ``is iterable`` test is true for strings).

The two templates differ only in the default date (3.1: fixed, 3.2: the render's day) and
3.1's ``builtin_tools`` (left to the template)."""

from __future__ import annotations

from datetime import date
from typing import Any

from proxy.prompt.fast.common import (
    FastRenderer,
    Unsupported,
    arguments_json,
    check_request_calls,
    day_string,
    json_string,
    request_function,
    request_text,
    text,
    tojson,
    tojson_indent4,
    validate_request_calls,
)

_FORMAT = (
    'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}.Do not use variables.\n\n"
)
_SYSTEM_TOOLS = (
    "You have access to the following functions. To call a function, please respond with JSON "
    "for a function call." + _FORMAT
)
_USER_TOOLS = (
    "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond "
    "with a JSON for a function call with its proper arguments that best answers the given "
    "prompt.\n\n" + _FORMAT
)


def render_3_1(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **variables: Any
) -> str:
    return _render_3_1(messages, tools, add_generation_prompt, variables, request=False)


def render_3_1_request(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **variables: Any
) -> str:
    return _render_3_1(messages, tools, add_generation_prompt, variables, request=True)


def render_3_2(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **variables: Any
) -> str:
    return _render_3_2(messages, tools, add_generation_prompt, today, variables, request=False)


def render_3_2_request(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **variables: Any
) -> str:
    return _render_3_2(messages, tools, add_generation_prompt, today, variables, request=True)


RENDERER_3_1 = FastRenderer(render_3_1, render_3_1_request)
RENDERER_3_2 = FastRenderer(render_3_2, render_3_2_request)


def _render_3_1(
    messages: Any, tools: Any, add_generation_prompt: Any, variables: dict[str, Any], request: bool
) -> str:
    """Llama 3.1/3.3: the date line says 26 Jul 2024 unless ``date_string`` is given."""
    if "builtin_tools" in variables:
        raise Unsupported
    day = variables.get("date_string", "26 Jul 2024")
    return _render(messages, tools, add_generation_prompt, day, variables, request)


def _render_3_2(
    messages: Any,
    tools: Any,
    add_generation_prompt: Any,
    today: date | None,
    variables: dict[str, Any],
    request: bool,
) -> str:
    """Llama 3.2: the date line shows the render's day unless ``date_string`` is given."""
    day = variables["date_string"] if "date_string" in variables else day_string(today)
    return _render(messages, tools, add_generation_prompt, day, variables, request)


def _render(
    messages: Any,
    tools: Any,
    add_generation_prompt: Any,
    day: Any,
    variables: dict[str, Any],
    request: bool,
) -> str:
    bos = variables.get("bos_token", "")
    in_user = variables.get("tools_in_user_message", True)
    if (
        "custom_tools" in variables
        or type(bos) is not str
        or type(day) is not str
        or type(in_user) is not bool
        or not (tools is None or type(tools) is list)
        or type(messages) is not list
        or not messages
    ):
        raise Unsupported
    read = request_text if request else text
    start = 0
    system = ""
    if _message(messages[0], request).get("role") == "system":
        system = _header_content(messages[0], read, request)
        start = 1
    out = [bos, "<|start_header_id|>system<|end_header_id|>\n\n"]
    if tools is not None:
        out.append("Environment: ipython\n")
    out.append(f"Cutting Knowledge Date: December 2023\nToday Date: {day}\n\n")
    if tools is not None and not in_user:
        out.append(_SYSTEM_TOOLS)
        out.extend([tojson_indent4(tool) + "\n\n" for tool in tools])
    out.append(system + "<|eot_id|>")
    if tools is not None and in_user:
        if start == len(messages):  # the template raises: no first user message
            raise Unsupported
        first = _header_content(_message(messages[start], request), read, request)
        out.append(_USER_TOOLS)
        out.extend([tojson_indent4(tool) + "\n\n" for tool in tools])
        out.append(first + "<|eot_id|>")
        start += 1
    append = out.append
    for index in range(start, len(messages)):
        message = _message(messages[index], request)
        content = message.get("content")
        if type(content) is not str:
            content = read(content)  # even if unread: ChatTemplate joins every message's parts
        if request:
            has_calls = check_request_calls(message.get("tool_calls"))
        else:
            has_calls = "tool_calls" in message
        if has_calls:
            append(_tool_call(message["tool_calls"], request))
            continue
        role = message.get("role")
        if role == "tool" or role == "ipython":
            append(
                f"<|start_header_id|>ipython<|end_header_id|>\n\n{json_string(content)}<|eot_id|>"
            )
        elif type(role) is str:
            append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>")
        else:
            raise Unsupported
    if add_generation_prompt:
        append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def _message(message: Any, request: bool) -> dict[str, Any]:
    """A message the template can read (from a request: one normalization accepts)."""
    if type(message) is not dict or (request and type(message.get("role")) is not str):
        raise Unsupported
    return message


def _header_content(message: dict[str, Any], read: Any, request: bool) -> str:
    """The trimmed content of the system or first user message, which the template prints
    in its header, ignoring any tool calls."""
    if request and check_request_calls(message.get("tool_calls")):
        validate_request_calls(message["tool_calls"])
    return read(message.get("content")).strip()


def _tool_call(calls: Any, request: bool) -> str:
    """An assistant turn with its one tool call (the template raises on more or fewer)."""
    if type(calls) is not list or len(calls) != 1:
        raise Unsupported
    if request:
        function = request_function(calls[0])
        arguments = arguments_json(function.get("arguments"))
    else:
        function = calls[0].get("function") if type(calls[0]) is dict else None
        if type(function) is not dict or "arguments" not in function:
            raise Unsupported
        arguments = tojson(function["arguments"])
    name = function.get("name")
    if type(name) is not str:
        raise Unsupported
    return (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "'
        f'{name}", "parameters": {arguments}}}<|eot_id|>'
    )
