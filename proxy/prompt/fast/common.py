"""What the fast renderers share: the step-aside signal, content as the template sees it,
and Hugging Face's ``tojson`` (``json.dumps(value, ensure_ascii=False)``) without its
per-call setup."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date
from json.encoder import c_make_encoder, encode_basestring
from typing import Any

FastRenderer = Callable[..., str]
"""``render(messages, tools, add_generation_prompt, today, **kwargs) -> str``: the text the
Jinja template renders from the same arguments (``kwargs`` are the template's other
variables: ``bos_token``, ``eos_token`` and the request's ``chat_template_kwargs``)."""


class Unsupported(Exception):
    """An input a fast renderer does not reproduce exactly: the Jinja template renders it."""


def text(content: Any) -> str:
    """Message content as the template gets it: a string, or text parts joined by newlines
    (what ``ChatTemplate`` does for templates that expect strings)."""
    if type(content) is str:
        return content
    if type(content) is list:
        try:
            return "\n".join([part["text"] for part in content])
        except (KeyError, TypeError) as exc:
            raise Unsupported from exc
    raise Unsupported


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


# ``tojson(indent=4)`` runs json's pure-Python encoder (slow), on the same tool list every
# request: its text is kept by the compact encoding, which determines it.
_INDENTED_LIMIT = 512
_indented: dict[str, str] = {}


def tojson_indent4(value: Any) -> str:
    """``value | tojson(indent=4)`` as the templates print it."""
    key = tojson(value)
    out = _indented.get(key)
    if out is None:
        try:
            out = json.dumps(value, ensure_ascii=False, indent=4)
        except (TypeError, ValueError, RecursionError) as exc:
            raise Unsupported from exc
        if len(_indented) >= _INDENTED_LIMIT:
            _indented.clear()
        _indented[key] = out
    return out


def day_string(today: date | None) -> str:
    """``strftime_now("%d %b %Y")`` for a render on ``today`` (default: the local date)."""
    return (today or date.today()).strftime("%d %b %Y")
