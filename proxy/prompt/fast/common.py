"""What the fast renderers share: the step-aside signal, the renderer pair, message fields
as templates see them (from canonical messages, or from messages as a request sent them),
and Hugging Face's ``tojson`` (``json.dumps(value, ensure_ascii=False)``) without its
per-call setup."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from json.encoder import c_make_encoder, encode_basestring
from typing import Any

from proxy.prompt.errors import PromptError
from proxy.prompt.messages import parse_arguments, part_text

Render = Callable[..., str]
"""``(messages, tools, add_generation_prompt, today, **variables) -> str``; the variables are
the template's others: ``bos_token``, ``eos_token`` and ``chat_template_kwargs``."""


@dataclass(frozen=True, slots=True)
class FastRenderer:
    """One built-in template's fast renderer, in two forms that give the same text.

    ``render`` takes what ``ChatTemplate.render`` takes (canonical messages, see
    ``proxy.prompt.messages``) and returns what the Jinja template renders from them.
    ``render_request`` takes a chat request's messages as sent and returns what ``render``
    returns once they are normalized, without building the normalized copies; it steps aside
    from whatever normalization would reject, so that normalization reports it.
    """

    render: Render
    render_request: Render


class Unsupported(Exception):
    """An input a fast renderer does not reproduce exactly: the Jinja template renders it."""


def text(content: Any) -> str:
    """Canonical content as the template gets it: a string, or text parts joined by
    newlines (what ``ChatTemplate`` does for templates that expect strings)."""
    if type(content) is str:
        return content
    if type(content) is list:
        try:
            return "\n".join([part["text"] for part in content])
        except (KeyError, TypeError) as exc:
            raise Unsupported from exc
    raise Unsupported


def request_text(content: Any) -> str:
    """Request content as the template gets it once normalized: null is "", parts are
    joined by newlines as their text, refusal or placeholder (normalization's own
    ``part_text``)."""
    if type(content) is str:
        return content
    if content is None:
        return ""
    if type(content) is not list:
        raise Unsupported
    try:
        return "\n".join([part_text(part, "content") for part in content])
    except PromptError as exc:
        raise Unsupported from exc


def check_request_calls(calls: Any) -> bool:
    """Whether a request message makes tool calls: null and [] are none (normalization drops
    them); anything but a list is left to normalization to reject."""
    if calls is None:
        return False
    if type(calls) is not list:
        raise Unsupported
    return bool(calls)


def validate_request_calls(calls: list[Any]) -> None:
    """Tool calls the template ignores, checked as normalization checks them."""
    for call in calls:
        request_function(call)


def request_function(call: Any) -> dict[str, Any]:
    """A request tool call's function, with a string name, as normalization requires."""
    function = call.get("function") if type(call) is dict else None
    if type(function) is not dict or type(function.get("name")) is not str:
        raise Unsupported
    return function


def _compact_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False)``: the C encoder that call builds each time
    (``JSONEncoder.iterencode`` with the same arguments), built once. Without circular
    reference checks: a cycle ends in RecursionError, which ``tojson`` turns into a step
    aside, so the Jinja path reports it as before."""
    defaults = json.JSONEncoder(ensure_ascii=False)
    if c_make_encoder is None:
        return defaults.encode
    encoder = c_make_encoder(
        None,
        defaults.default,
        encode_basestring,
        None,
        defaults.key_separator,
        defaults.item_separator,
        defaults.sort_keys,
        defaults.skipkeys,
        defaults.allow_nan,
    )
    return lambda value: "".join(encoder(value, 0))


_dumps = _compact_encoder()


def tojson(value: Any) -> str:
    """``value | tojson`` as the templates print it."""
    try:
        return _dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise Unsupported from exc


class TextMemo:
    """A str -> value memo for work that agents repeat every turn (they resend the whole
    conversation); it forgets everything once its keys hold ``limit`` characters, and
    keeps no key longer than a sixteenth of that. ``get`` is the dict's own (a lookup costs
    one C call). For one thread (the proxy renders on its event loop)."""

    __slots__ = ("_chars", "_items", "get", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chars = 0
        self._items: dict[str, Any] = {}
        self.get = self._items.get

    def put(self, key: str, value: Any) -> None:
        if len(key) > self.limit // 16:
            return
        self._chars += len(key)
        if self._chars > self.limit:
            self._items.clear()
            self._chars = len(key)
        self._items[key] = value


# Tool results, printed as JSON strings by the Llama templates (escaping costs ~3 ns a
# character; looking a string up costs a tenth of that).
_json_strings = TextMemo(1 << 23)


def json_string(value: str) -> str:
    """``value | tojson`` for a string."""
    if len(value) < 256:
        return encode_basestring(value)
    out = _json_strings.get(value)
    if out is None:
        out = encode_basestring(value)
        _json_strings.put(value, out)
    return out


# tojson(indent=4) runs json's pure-Python encoder (slow), on the same tool list every
# request: its text is kept by the compact encoding, which determines it.
_indented = TextMemo(1 << 20)


def tojson_indent4(value: Any) -> str:
    """``value | tojson(indent=4)`` as the templates print it."""
    key = tojson(value)
    out = _indented.get(key)
    if out is None:
        try:
            out = json.dumps(value, ensure_ascii=False, indent=4)
        except (TypeError, ValueError, RecursionError) as exc:
            raise Unsupported from exc
        _indented.put(key, out)
    return out


# A request's arguments text -> (tojson of the parsed value, the parsed value if a string).
_arguments = TextMemo(1 << 21)


def _parsed_arguments(raw: Any) -> tuple[str, str | None]:
    if type(raw) is not str:
        if isinstance(raw, str):
            raise Unsupported
        return tojson(parse_arguments(raw)), None
    parsed = parse_arguments(raw)
    entry = (tojson(parsed), parsed if type(parsed) is str else None)
    _arguments.put(raw, entry)
    return entry


def arguments_json(raw: Any) -> str:
    """``arguments | tojson`` for a request's raw arguments, parsed as normalization
    parses them (JSON text parsed when it parses, null as {})."""
    entry = _arguments.get(raw) if type(raw) is str else None
    return (entry or _parsed_arguments(raw))[0]


def arguments_text(raw: Any) -> str:
    """What ``{% if arguments is string %}{{ arguments }}{% else %}{{ arguments | tojson
    }}{% endif %}`` prints for a request's raw arguments, parsed as normalization does."""
    entry = _arguments.get(raw) if type(raw) is str else None
    as_json, as_string = entry or _parsed_arguments(raw)
    return as_json if as_string is None else as_string


def day_string(today: date | None) -> str:
    """``strftime_now("%d %b %Y")`` for a render on ``today`` (default: the local date)."""
    return (today or date.today()).strftime("%d %b %Y")
