"""Chat templates rendered the way Hugging Face ``apply_chat_template`` renders them.

Same Jinja2 setup as transformers: an immutable sandbox, ``trim_blocks``, ``lstrip_blocks``,
the ``loopcontrols`` extension and the ``{% generation %}`` tag; ``raise_exception`` and
``strftime_now`` globals; and a ``tojson`` filter that keeps non-ASCII text as is.

``strftime_now`` formats midnight of the render's ``today`` rather than the current time:
templates that print the date (Llama 3.2's "Today Date: 26 Jul 2024") then give the same
text all day, so routing keys stay stable within a day and change only at midnight, when the
engine's own rendering changes too. Templates that print the time of day get "00:00".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from proxy.prompt.errors import PromptError, TemplateRenderError
from proxy.prompt.fast import Unsupported, fast_renderer


class TemplateRaised(jinja2.TemplateError):
    """What a template's ``raise_exception(message)`` raises."""


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks assistant text with it;
    for rendering it is a no-op around its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


_DICT_ATTRIBUTES = frozenset(dir(dict))
_DICT_READERS = frozenset({"get", "items", "keys", "values"})
_STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_")) - {
    "format",
    "format_map",
}


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a fast path for the lookups templates do most: a key of a
    message (``message.role``), a dict reader (``message.get``), a str method
    (``content.strip``), a loop variable (``loop.last``) or a namespace field (``ns.index``).
    Each returns what the sandbox's own lookup returns, without its exception and
    safety-check overhead (which otherwise dominates rendering a long conversation)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict:
            if attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            if attribute in _DICT_READERS:
                return getattr(obj, attribute)
        if kind is str and attribute in _STR_METHODS:
            return getattr(obj, attribute)
        if (kind is LoopContext or kind is Namespace) and not attribute.startswith("_"):
            try:
                return getattr(obj, attribute)
            except AttributeError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


_ENV = _environment()

# A template handles a list of content parts if it loops over a message's content (the
# test vLLM uses too); other templates get the parts joined into one string.
_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+\w+(?:\.content|\[\s*['\"]content['\"]\s*\])")


class _DayClock:
    """``strftime_now`` for one render: the given day at midnight."""

    __slots__ = ("_midnight",)

    def __init__(self, today: date) -> None:
        self._midnight = datetime.combine(today, time())

    def __call__(self, fmt: str) -> str:
        return self._midnight.strftime(fmt)


def _flatten_parts(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Messages with list content joined into one string (text parts joined by newlines, as
    vLLM does for templates that expect strings)."""
    out: list[Mapping[str, Any]] = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            text = "\n".join(part["text"] for part in message["content"])
            message = {**message, "content": text}
        out.append(message)
    return out


class ChatTemplate:
    """One compiled chat template with its special tokens; compile once, render many times.

    ``render`` takes messages in the proxy's canonical form (see ``proxy.prompt.messages``):
    content is a string or a list of ``{"type": "text", "text": ...}`` parts. ``fast`` is
    the template's fast renderer (``proxy.prompt.fast``) when its source is a built-in that
    has one: requests render through it, and through Jinja whatever it steps aside from.
    """

    __slots__ = (
        "_template",
        "accepts_content_parts",
        "bos_token",
        "eos_token",
        "fast",
        "name",
        "source",
    )

    def __init__(self, name: str, source: str, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(f"chat template {name!r} does not compile: {exc}") from exc
        self.name = name
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.accepts_content_parts = _LOOPS_OVER_CONTENT.search(source) is not None
        self.fast = fast_renderer(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        today: date | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text; ``today`` feeds ``strftime_now`` (default: the local date).

        Raises ``TemplateRenderError`` whatever goes wrong inside the template.
        """
        if self.fast is not None:
            variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
            try:
                return self.fast.render(messages, tools, add_generation_prompt, today, **variables)
            except Unsupported:
                pass
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **kwargs,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "strftime_now": _DayClock(today or date.today()),
        }
        try:
            if not self.accepts_content_parts:
                context["messages"] = _flatten_parts(messages)
            return self._template.render(context)
        except Exception as exc:
            raise TemplateRenderError(f"chat template {self.name!r} failed: {exc}") from exc

    def try_render_request(
        self,
        messages: Any,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        today: date | None = None,
        **kwargs: Any,
    ) -> str | None:
        """What ``render`` returns for a chat request's messages once normalized, straight
        from the messages as sent (no normalized copies), or None where this template has
        no fast renderer or it steps aside: then normalize and ``render``."""
        if self.fast is None:
            return None
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        try:
            return self.fast.render_request(
                messages, tools, add_generation_prompt, today, **variables
            )
        except Unsupported:
            return None

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r})"
