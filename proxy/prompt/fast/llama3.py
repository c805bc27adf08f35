"""Llama 3.1/3.3 (``builtin/llama3.jinja``) and Llama 3.2 (``builtin/llama3_2.jinja``):
a system header with the date line, the tool list as indented JSON in the first user
message (or in the system message with ``tools_in_user_message=False``), one tool call per
assistant turn as ``{"name": ..., "parameters": ...}`` and tool results in ``ipython`` turns,
printed as JSON strings (the template's ``is iterable`` test is true for strings).

The two templates differ only in the default date (3.1: fixed, 3.2: the render's day) and
3.1's ``builtin_tools`` (left to the template)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from proxy.prompt.fast.common import Unsupported, day_string, text, tojson, tojson_indent4

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
    messages: Sequence[Any],
    tools: Any,
    add_generation_prompt: Any,
    today: date | None,
    **kwargs: Any,
) -> str:
    """Llama 3.1/3.3: the date line says 26 Jul 2024 unless ``date_string`` is given."""
    if "builtin_tools" in kwargs:
        raise Unsupported
    day = kwargs.get("date_string", "26 Jul 2024")
    return _render(messages, tools, add_generation_prompt, day, kwargs)


def render_3_2(
    messages: Sequence[Any],
    tools: Any,
    add_generation_prompt: Any,
    today: date | None,
    **kwargs: Any,
) -> str:
    """Llama 3.2: the date line shows the render's day unless ``date_string`` is given."""
    day = kwargs["date_string"] if "date_string" in kwargs else day_string(today)
    return _render(messages, tools, add_generation_prompt, day, kwargs)


def _render(
    messages: Sequence[Any],
    tools: Any,
    add_generation_prompt: Any,
    day: Any,
    kwargs: dict[str, Any],
) -> str:
    bos = kwargs.get("bos_token", "")
    in_user = kwargs.get("tools_in_user_message", True)
    if (
        "custom_tools" in kwargs
        or type(bos) is not str
        or type(day) is not str
        or type(in_user) is not bool
        or not (tools is None or type(tools) is list)
        or type(messages) is not list
        or not messages
    ):
        raise Unsupported
    start = 0
    system = ""
    if _message(messages[0]).get("role") == "system":
        system = _content(messages[0]).strip()
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
        out.append(_USER_TOOLS)
        out.extend([tojson_indent4(tool) + "\n\n" for tool in tools])
        out.append(_content(_message(messages[start])).strip() + "<|eot_id|>")
        start += 1
    append = out.append
    for index in range(start, len(messages)):
        message = _message(messages[index])
        if "tool_calls" in message:
            append(_tool_call(message["tool_calls"]))
            continue
        role = message.get("role")
        content = message.get("content")
        if type(content) is not str:
            content = text(content)
        if role == "tool" or role == "ipython":
            append(f"<|start_header_id|>ipython<|end_header_id|>\n\n{tojson(content)}<|eot_id|>")
        elif type(role) is str:
            append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>")
        else:
            raise Unsupported
    if add_generation_prompt:
        append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def _message(message: Any) -> dict[str, Any]:
    if type(message) is not dict:
        raise Unsupported
    return message


def _content(message: dict[str, Any]) -> str:
    return text(message.get("content"))


def _tool_call(calls: Any) -> str:
    """An assistant turn with its one tool call (the template raises on more or fewer)."""
    if type(calls) is not list or len(calls) != 1 or type(calls[0]) is not dict:
        raise Unsupported
    function = calls[0].get("function")
    if type(function) is not dict or "arguments" not in function:
        raise Unsupported
    name = function.get("name")
    if type(name) is not str:
        raise Unsupported
    arguments = tojson(function["arguments"])
    return (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "'
        f'{name}", "parameters": {arguments}}}<|eot_id|>'
    )
