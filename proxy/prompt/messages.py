"""Chat messages in the one shape every template is rendered from.

Canonical form: a message is a dict with a string ``role``, ``content`` that is a string or
a list of ``{"type": "text", "text": ...}`` parts (null content becomes ""), tool calls
with ``function.arguments`` parsed from JSON (as vLLM passes them to templates), and no
null-valued keys. Parts that are not text (images, audio, files) become a stable
placeholder such as ``<image:1f2e...>``, hashed from the part itself, so two requests that
differ only in an image never share a key beyond it.

Every malformed shape raises ``PromptError`` naming the field.
"""

from __future__ import annotations

from typing import Any

import orjson
import xxhash

from proxy.prompt.errors import PromptError

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_PLACEHOLDER_LABELS = {
    "image_url": "image",
    "input_image": "image",
    "image": "image",
    "input_audio": "audio",
    "audio": "audio",
    "video_url": "video",
    "video": "video",
    "file": "file",
    "input_file": "file",
    "document": "file",
}
# Names the renderer sets itself; chat_template_kwargs cannot override them.
_RESERVED_KWARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "today", "strftime_now", "raise_exception"}
)


def _placeholder(part: dict[str, Any], kind: str, where: str) -> str:
    try:
        encoded = orjson.dumps(part, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        raise PromptError(f"{where} cannot be encoded: {exc}") from exc
    label = _PLACEHOLDER_LABELS.get(kind, "part")
    return f"<{label}:{xxhash.xxh3_64_intdigest(encoded):016x}>"


def part_text(part: Any, where: str) -> str:
    """One content part as text: its text, its refusal, or a placeholder."""
    if not isinstance(part, dict):
        raise PromptError(f"{where} must be an object")
    kind = part.get("type")
    if not isinstance(kind, str):
        raise PromptError(f"{where}.type must be a string")
    if kind in _TEXT_PART_TYPES:
        text = part.get("text")
        if not isinstance(text, str):
            raise PromptError(f"{where}.text must be a string")
        return text
    if kind == "refusal":
        refusal = part.get("refusal")
        if not isinstance(refusal, str):
            raise PromptError(f"{where}.refusal must be a string")
        return refusal
    return _placeholder(part, kind, where)


def content(value: Any, where: str) -> str | list[dict[str, str]]:
    """Message content: a string, or parts as text parts (null is "")."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [
            {"type": "text", "text": part_text(part, f"{where}[{i}]")}
            for i, part in enumerate(value)
        ]
    raise PromptError(f"{where} must be a string, a list of parts or null")


def parse_arguments(value: Any) -> Any:
    """Tool call arguments as templates expect them: JSON text parsed when it parses."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return {} if value is None else value


def tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """A message's tool calls, checked, with arguments parsed."""
    if not isinstance(value, list):
        raise PromptError(f"{where} must be a list")
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise PromptError(_call_problem(call, f"{where}[{i}]"))
        parsed = {**function, "arguments": parse_arguments(function.get("arguments"))}
        calls.append({**call, "type": call.get("type") or "function", "function": parsed})
    return calls


def _call_problem(call: Any, where: str) -> str:
    if not isinstance(call, dict):
        return f"{where} must be an object"
    if not isinstance(call.get("function"), dict):
        return f"{where}.function must be an object"
    return f"{where}.function.name must be a string"


def message(value: Any, where: str) -> dict[str, Any]:
    """One chat message in canonical form."""
    if not isinstance(value, dict):
        raise PromptError(f"{where} must be an object")
    if not isinstance(value.get("role"), str):
        raise PromptError(f"{where}.role must be a string")
    out = {key: item for key, item in value.items() if item is not None}
    text = value.get("content")
    if text is None:
        out["content"] = ""
    elif type(text) is not str:
        out["content"] = content(text, f"{where}.content")
    calls = value.get("tool_calls")
    if calls is None or calls == []:
        out.pop("tool_calls", None)
    else:
        out["tool_calls"] = tool_calls(calls, f"{where}.tool_calls")
    return out


def messages(value: Any, where: str = "messages") -> list[dict[str, Any]]:
    """A non-empty list of chat messages in canonical form.

    A message already in it (a string role and content, no tool calls, no nulls) is passed
    through as is, not copied: the common case costs a few lookups.
    """
    if not isinstance(value, list) or not value:
        raise PromptError(f"{where} must be a non-empty list")
    out = []
    for i, item in enumerate(value):
        if (
            type(item) is dict
            and type(item.get("content")) is str
            and type(item.get("role")) is str
            and "tool_calls" not in item
            and None not in item.values()
        ):
            out.append(item)
        else:
            out.append(message(item, f"{where}[{i}]"))
    return out


def tools(value: Any, where: str = "tools") -> list[dict[str, Any]] | None:
    """A tool list (objects, passed to the template as given) or None."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise PromptError(f"{where} must be a list of objects")
    return value


def template_kwargs(value: Any, where: str = "chat_template_kwargs") -> dict[str, Any]:
    """Extra template variables (e.g. enable_thinking), minus the reserved names."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PromptError(f"{where} must be an object")
    return {key: item for key, item in value.items() if key not in _RESERVED_KWARGS}
