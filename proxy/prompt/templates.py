"""Built-in chat templates, and which one a model name gets.

The built-ins are the templates the model repositories publish (Qwen2.5, Qwen3, Llama 3.1/3.3,
Llama 3.2, Mistral Nemo (v3 "tekken"), Mistral Small 3 (v7, ``[SYSTEM_PROMPT]``), Gemma 3),
plus plain ChatML, used when nothing better is configured or reported by the backend. They
are picked by the first regex below that matches the model name (case-insensitive).

When no pattern matches, the ``fallback`` template renders each message as
``<|role|>\\n{content}\\n`` (tool calls as sorted JSON), with the tool list first. It is not what
the engine sees, but it is deterministic and prefix-stable: every message's text depends on
that message alone and is appended in order, and nothing depends on which message is last,
so a conversation's key is a prefix of its continuation's key, like the engine's prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from proxy.prompt.sources import LoadedTemplate

FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class Builtin:
    """One built-in template: its file (``builtin/<name>.jinja``), model names, tokens."""

    name: str
    pattern: re.Pattern[str]
    bos_token: str
    eos_token: str


def _builtin(name: str, pattern: str, bos_token: str, eos_token: str) -> Builtin:
    return Builtin(name, re.compile(pattern, re.IGNORECASE), bos_token, eos_token)


# Order matters: the first match wins, so specific names come before their family.
BUILTINS: tuple[Builtin, ...] = (
    _builtin("qwen3", r"qwen-?3", "", "<|im_end|>"),
    _builtin("qwen2_5", r"qwen|qwq", "", "<|im_end|>"),
    _builtin("chatml", r"chatml", "", "<|im_end|>"),
    _builtin("llama3_2", r"llama-?3[._-]2(?!\d)", "<|begin_of_text|>", "<|eot_id|>"),
    _builtin("llama3", r"llama-?3", "<|begin_of_text|>", "<|eot_id|>"),
    _builtin("mistral_small_3", r"mistral-small-(?:3|24b)|magistral|devstral", "<s>", "</s>"),
    _builtin("mistral_nemo", r"mistral|mixtral|ministral", "<s>", "</s>"),
    _builtin("gemma", r"gemma", "<bos>", "<eos>"),
)


def builtin_name_for(model: str) -> str | None:
    """The built-in template a model name matches, or None."""
    for builtin in BUILTINS:
        if builtin.pattern.search(model):
            return builtin.name
    return None


@cache
def builtin_templates() -> dict[str, LoadedTemplate]:
    """Every built-in (and the fallback) by name, read once from the package."""
    folder = files("proxy.prompt") / "builtin"
    loaded = {
        b.name: LoadedTemplate(
            (folder / f"{b.name}.jinja").read_text(encoding="utf-8"), b.bos_token, b.eos_token
        )
        for b in BUILTINS
    }
    loaded[FALLBACK] = LoadedTemplate((folder / f"{FALLBACK}.jinja").read_text(encoding="utf-8"))
    return loaded
