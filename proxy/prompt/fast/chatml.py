"""Plain ChatML (``builtin/chatml.jinja``, also what llama.cpp reports for ChatML models):
each message as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from proxy.prompt.fast.common import Unsupported, text


def render(
    messages: Sequence[Any],
    tools: Any,
    add_generation_prompt: Any,
    today: date | None,
    **kwargs: Any,
) -> str:
    """The template reads nothing but the messages and ``add_generation_prompt``."""
    if type(messages) is not list:
        raise Unsupported
    out = []
    for message in messages:
        if type(message) is not dict:
            raise Unsupported
        role = message.get("role")
        content = message.get("content")
        if type(role) is not str:
            raise Unsupported
        if type(content) is not str:
            content = text(content)
        out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
