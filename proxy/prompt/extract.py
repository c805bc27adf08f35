"""The routing key text of a request body, per endpoint.

- ``chat``: the conversation rendered with the model's chat template (tools and
  ``chat_template_kwargs`` included), without the generation prompt.
- ``responses`` and ``messages`` (Anthropic): converted to chat messages and tools, then
  rendered the same way, so the same conversation gives the same key on every endpoint.
- ``completions``: the prompt itself. A batch (list) of prompts goes to one backend and is
  keyed by its first prompt, which carries the prefix batches usually share (few-shot
  examples, a document). Token ids become 4 base64 characters per token (ids below 2**24),
  so a 128-character block is exactly 32 tokens and a longer id list extends the text.
- ``embeddings`` and ``other``: None, routed by load alone.

A request's ``chat_template`` field is ignored: compiling templates sent by clients would let
any client spend the proxy's CPU.
"""

from __future__ import annotations

import base64
import sys
from array import array
from datetime import date
from typing import Any

from proxy.prompt import messages as chat
from proxy.prompt.errors import PromptError
from proxy.prompt.registry import TemplateRegistry

ENDPOINTS = frozenset({"chat", "completions", "responses", "messages", "embeddings", "other"})
_TOKEN_ID_LIMIT = 1 << 24


def routing_text(
    endpoint: str, body: Any, registry: TemplateRegistry, today: date | None = None
) -> str | None:
    """The text whose block hashes route this request, or None for load-only routing.

    ``today`` feeds templates that print the date (default: the local date). Raises
    ``PromptError`` (naming the field) for a body of the wrong shape, and nothing else.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint kind {endpoint!r}")
    if endpoint in ("embeddings", "other"):
        return None
    if not isinstance(body, dict):
        raise PromptError("the request body must be a JSON object")
    if endpoint == "completions":
        return _completion_text(body.get("prompt"))
    model = body.get("model")
    if model is None:
        model = ""
    elif not isinstance(model, str):
        raise PromptError("model must be a string")
    if endpoint == "chat":
        messages = body.get("messages")
        try:
            tools = chat.tools(body.get("tools"))
            kwargs = chat.template_kwargs(body.get("chat_template_kwargs"))
        except PromptError:
            chat.messages(messages)  # a malformed message is the error to report first
            raise
        return registry.render_chat(model, messages, tools, today, kwargs)
    if endpoint == "responses":
        conversation = _responses_messages(body)
        tools = _converted_tools(body.get("tools"), "parameters")
    else:
        conversation = _anthropic_messages(body)
        tools = _converted_tools(body.get("tools"), "input_schema")
    return registry.render_conversation(model, conversation, tools, today)


def _completion_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise PromptError("prompt must be a string, a list of strings or a list of token ids")
    first = prompt[0]
    if isinstance(first, str):
        if not all(isinstance(item, str) for item in prompt):
            raise PromptError("prompt mixes strings with other values")
        return first
    if isinstance(first, list):
        if not all(isinstance(item, list) for item in prompt):
            raise PromptError("prompt mixes token id lists with other values")
        return _token_text(first, "prompt[0]")
    return _token_text(prompt, "prompt")


def _token_text(ids: list[Any], where: str) -> str:
    """Token ids as text: each id as 3 little-endian bytes, base64-encoded (4 chars/token)."""
    try:
        packed = array("I", ids)  # 4 bytes per item on every platform CPython runs on
    except (TypeError, OverflowError) as exc:
        raise PromptError(f"{where} must hold integer token ids from 0 to 2**24 - 1") from exc
    if packed and max(packed) >= _TOKEN_ID_LIMIT:
        raise PromptError(f"{where} must hold integer token ids from 0 to 2**24 - 1")
    if sys.byteorder == "big":
        packed.byteswap()
    raw = bytearray(packed.tobytes())
    del raw[3::4]
    return base64.b64encode(raw).decode("ascii")


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise PromptError(f"{where}.{key} must be a string")
    return value


def _role(item: dict[str, Any], where: str) -> str:
    return _string(item, "role", where)


def _tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    function = {"name": name, "arguments": chat.parse_arguments(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def _responses_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses API ``instructions`` + ``input`` as canonical chat messages.

    Message items keep their role and content; ``function_call`` items become tool calls of
    the assistant message before them (or of a new one); ``function_call_output`` items
    become tool messages. Other item kinds (reasoning, built-in tool calls) are skipped.
    """
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise PromptError("instructions must be a string")
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    elif not isinstance(items, list):
        raise PromptError("input must be a string or a list of items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise PromptError(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            text = chat.content(item.get("content"), f"{where}.content")
            out.append({"role": _role(item, where), "content": text})
        elif kind == "function_call":
            call = _tool_call(
                _string(item, "call_id", where),
                _string(item, "name", where),
                _string(item, "arguments", where),
            )
            if out and out[-1]["role"] == "assistant":
                out[-1] = {**out[-1], "tool_calls": [*out[-1].get("tool_calls", ()), call]}
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = chat.content(item.get("output"), f"{where}.output")
            call_id = _string(item, "call_id", where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
    if not out:
        raise PromptError("input must not be empty")
    return out


def _anthropic_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Anthropic ``system`` + ``messages`` as canonical chat messages.

    ``tool_result`` blocks become tool messages (ahead of the rest of their user turn),
    ``tool_use`` blocks tool calls, ``thinking`` blocks the assistant's reasoning_content.
    """
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = chat.content(system, "system")
        if isinstance(text, list):
            text = "\n".join(part["text"] for part in text)
        out.append({"role": "system", "content": text})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise PromptError("messages must be a non-empty list")
    for i, turn in enumerate(turns):
        where = f"messages[{i}]"
        if not isinstance(turn, dict):
            raise PromptError(f"{where} must be an object")
        role = _role(turn, where)
        blocks = turn.get("content")
        if isinstance(blocks, list):
            out.extend(_anthropic_turn(role, blocks, f"{where}.content"))
        else:
            out.append({"role": role, "content": chat.content(blocks, f"{where}.content")})
    return out


def _anthropic_turn(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    turn: list[dict[str, Any]] = []
    parts: list[dict[str, str]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            result = chat.content(block.get("content"), f"{at}.content")
            call_id = _string(block, "tool_use_id", at)
            turn.append({"role": "tool", "tool_call_id": call_id, "content": result})
        elif kind == "tool_use":
            calls.append(
                _tool_call(_string(block, "id", at), _string(block, "name", at), block.get("input"))
            )
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", at))
        elif kind != "redacted_thinking":
            parts.append({"type": "text", "text": chat.part_text(block, at)})
    if parts or calls or not turn:
        message: dict[str, Any] = {"role": role, "content": parts}
        if calls:
            message["tool_calls"] = calls
        if thinking:
            message["reasoning_content"] = "\n".join(thinking)
        turn.append(message)
    return turn


def _converted_tools(value: Any, schema_key: str) -> list[dict[str, Any]] | None:
    """Responses (flat ``function`` tools) or Anthropic (``input_schema``) tools in the chat
    ``{"type": "function", "function": {...}}`` shape; other tool kinds are left out."""
    tools = chat.tools(value)
    if tools is None:
        return None
    converted = []
    for tool in tools:
        if schema_key not in tool and tool.get("type") != "function":
            continue
        function = {
            key: item
            for key, item in (
                ("name", tool.get("name")),
                ("description", tool.get("description")),
                ("parameters", tool.get(schema_key)),
            )
            if item is not None
        }
        converted.append({"type": "function", "function": function})
    return converted
