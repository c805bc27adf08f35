"""Where a model's chat template comes from: a template file, a Hugging Face
``tokenizer_config.json``, inline text, or a built-in family by name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.prompt.errors import PromptError


@dataclass(frozen=True, slots=True)
class LoadedTemplate:
    """Template text and the special tokens it is rendered with."""

    source: str
    bos_token: str = ""
    eos_token: str = ""


@dataclass(frozen=True, slots=True)
class TemplateSource:
    """Exactly one of ``file``, ``tokenizer_config``, ``inline`` or ``builtin``.

    ``bos_token``/``eos_token`` override the ones a tokenizer_config or built-in brings.
    """

    file: str | None = None
    tokenizer_config: str | None = None
    inline: str | None = None
    builtin: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None

    def __post_init__(self) -> None:
        given = [self.file, self.tokenizer_config, self.inline, self.builtin]
        if sum(value is not None for value in given) != 1:
            raise PromptError(
                "a template source needs exactly one of file, tokenizer_config, inline, builtin"
            )


def special_token(value: Any) -> str:
    """A tokenizer_config special token: a string, ``{"content": ...}`` or null."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return ""


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"cannot read {what} {str(path)!r}: {exc}") from exc


def _chat_template_field(value: Any, path: Path) -> str | None:
    """``chat_template`` as a string, or the list-of-{name, template} form's "default"."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default":
                template = entry.get("template")
                if isinstance(template, str):
                    return template
        raise PromptError(f"{str(path)!r}: chat_template list has no 'default' template")
    raise PromptError(f"{str(path)!r}: chat_template must be a string or a list")


def load_tokenizer_config(path: Path) -> LoadedTemplate:
    """The template and special tokens of a tokenizer_config.json.

    Newer transformers save the template beside it, as ``chat_template.jinja``; that file is
    used when the config itself has none.
    """
    try:
        config = json.loads(_read(path, "tokenizer_config"))
    except json.JSONDecodeError as exc:
        raise PromptError(f"{str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise PromptError(f"{str(path)!r} must hold a JSON object")
    source = _chat_template_field(config.get("chat_template"), path)
    if source is None:
        beside = path.with_name("chat_template.jinja")
        if not beside.is_file():
            raise PromptError(f"{str(path)!r} has no chat_template (and no chat_template.jinja)")
        source = _read(beside, "chat template")
    return LoadedTemplate(
        source, special_token(config.get("bos_token")), special_token(config.get("eos_token"))
    )


def load_source(source: TemplateSource, builtins: dict[str, LoadedTemplate]) -> LoadedTemplate:
    """Read one configured source (startup I/O only; rendering never touches files)."""
    if source.file is not None:
        loaded = LoadedTemplate(_read(Path(source.file), "chat template file"))
    elif source.tokenizer_config is not None:
        loaded = load_tokenizer_config(Path(source.tokenizer_config))
    elif source.inline is not None:
        loaded = LoadedTemplate(source.inline)
    else:
        if source.builtin not in builtins:
            known = ", ".join(sorted(builtins))
            raise PromptError(f"unknown built-in template {source.builtin!r} (known: {known})")
        loaded = builtins[source.builtin]
    return LoadedTemplate(
        loaded.source,
        loaded.bos_token if source.bos_token is None else source.bos_token,
        loaded.eos_token if source.eos_token is None else source.eos_token,
    )
