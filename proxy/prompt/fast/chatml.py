"""Plain ChatML (``builtin/chatml.jinja``, also what llama.cpp reports for ChatML models):
each message as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. The template reads nothing
but the messages and ``add_generation_prompt``."""

from __future__ import annotations

from typing import Any

from proxy.prompt.fast.common import (
    FastRenderer,
    Unsupported,
    check_request_calls,
    request_text,
    text,
    validate_request_calls,
)


def render(messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **_: Any) -> str:
    return _render(messages, add_generation_prompt, request=False)


def render_request(
    messages: Any, tools: Any, add_generation_prompt: Any, today: Any, **_: Any
) -> str:
    return _render(messages, add_generation_prompt, request=True)


RENDERER = FastRenderer(render, render_request)


def _render(messages: Any, add_generation_prompt: Any, request: bool) -> str:
    if type(messages) is not list or (request and not messages):
        raise Unsupported
    read = request_text if request else text
    out = []
    for message in messages:
        if type(message) is not dict:
            raise Unsupported
        role = message.get("role")
        content = message.get("content")
        if type(role) is not str:
            raise Unsupported
        if type(content) is not str:
            content = read(content)
        if request and check_request_calls(message.get("tool_calls")):
            validate_request_calls(message["tool_calls"])
        out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
