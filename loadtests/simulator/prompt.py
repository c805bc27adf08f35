"""Prompt text as the engine sees it: chat template rendering, token estimate, block hashes.

The simulator has no tokenizer. A token is approximated as 4 characters of rendered text
(``estimate_tokens`` = ceil(chars / 4)), so a cache block of ``block_tokens`` tokens is
``4 * block_tokens`` characters. Block hashes chain: each block's xxh3-64 is seeded with the
previous block's hash, so equal hashes mean equal prefixes, as in vLLM and SGLang.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import xxhash
from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHARS_PER_TOKEN = 4
ROOT_HASH = 0
DEFAULT_TEMPLATE_PATH = Path(__file__).with_name("templates") / "chatml.jinja"


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def block_chars(block_tokens: int) -> int:
    return CHARS_PER_TOKEN * block_tokens


def chain_hashes(text: str, chars_per_block: int, parent: int = ROOT_HASH) -> list[int]:
    """Hashes of the full blocks of ``text``, chained from ``parent``; a partial tail is skipped."""
    hashes: list[int] = []
    for start in range(0, len(text) - chars_per_block + 1, chars_per_block):
        block = text[start : start + chars_per_block].encode("utf-8", "surrogatepass")
        parent = xxhash.xxh3_64_intdigest(block, seed=parent)
        hashes.append(parent)
    return hashes


def text_seed(text: str) -> int:
    """A deterministic seed for the filler answer, so equal prompts get equal answers."""
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


class PromptError(ValueError):
    """The request cannot be turned into prompt text; the message says why."""


class ChatRenderer:
    """Renders chat messages with a Hugging Face style Jinja2 chat template."""

    def __init__(self, source: str) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self._template = env.from_string(source)

    @classmethod
    def from_file(cls, path: str | Path | None) -> ChatRenderer:
        return cls(Path(path or DEFAULT_TEMPLATE_PATH).read_text(encoding="utf-8"))

    def render(self, messages: Sequence[dict[str, Any]], tools: list[Any] | None) -> str:
        """The prompt text, ending with the generation prompt as a real engine renders it."""
        if not messages:
            raise PromptError("messages must be a non-empty list")
        try:
            return self._template.render(
                messages=[_normalize_message(m) for m in messages],
                tools=tools or None,
                add_generation_prompt=True,
                bos_token="",
                eos_token="<|im_end|>",
            )
        except TemplateError as e:
            raise PromptError(f"chat template failed: {e}") from e


def _normalize_message(message: Any) -> dict[str, Any]:
    """Flatten text parts into a string, as vLLM does for string-content templates."""
    if not isinstance(message, dict):
        raise PromptError("each message must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise PromptError("each message needs a string 'role'")
    out = dict(message)
    out["content"] = content_text(message.get("content"))
    return out


def content_text(content: Any) -> str:
    """Text of an OpenAI/Anthropic content field: a string, null, or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict):
                parts.append(json.dumps(part, ensure_ascii=False, sort_keys=True))
            else:
                raise PromptError("content parts must be objects or strings")
        return "\n".join(parts)
    raise PromptError("message content must be a string, null or a list of parts")


def _tojson(
    value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
