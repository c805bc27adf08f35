"""Read and check a client request once: size limit, one JSON parse, the fields routing needs.

The proxy validates only what it must understand to route (the model, the shape of the
prompt fields); everything else (``n``, ``max_tokens``, sampling) goes to the engine
unchanged, in the original bytes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash
from aiohttp import web

from proxy.errors import ProxyError

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
}
# The field that must be present (and its accepted JSON types) per endpoint.
_PROMPT_FIELD: dict[str, tuple[str, tuple[type, ...]]] = {
    "chat": ("messages", (list,)),
    "completions": ("prompt", (str, list)),
    "responses": ("input", (str, list)),
    "embeddings": ("input", (str, list)),
    "messages": ("messages", (list,)),
}


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: str
    body: dict[str, Any]
    model: str
    stream: bool
    conversation_key: str | None


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole body; 413 as soon as it is known to exceed ``limit``, 408 if it trickles
    in slower than ``timeout_s`` allows."""
    if request.content_length is not None and request.content_length > limit:
        raise ProxyError(413, f"request body exceeds {limit} bytes", "body_too_large")
    if request.content.is_eof():  # the whole body came with the head: nothing to wait for
        body = request.content.read_nowait()
        if len(body) > limit:
            raise ProxyError(413, f"request body exceeds {limit} bytes", "body_too_large")
        return body
    chunks = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.content.iter_chunked(65536):
                size += len(chunk)
                if size > limit:
                    raise ProxyError(413, f"request body exceeds {limit} bytes", "body_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise ProxyError(
            408, f"request body not received within {timeout_s:.0f}s", "body_timeout"
        ) from None
    return b"".join(chunks)


def parse_request(endpoint: str, raw: bytes) -> ParsedRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ProxyError(400, f"request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "request body must be a JSON object", "invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProxyError(400, "'model' must be a non-empty string", "invalid_model", "model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ProxyError(400, "'stream' must be a boolean", "invalid_type", "stream")
    spec = _PROMPT_FIELD.get(endpoint)
    if spec is not None:
        name, types = spec
        value = body.get(name)
        if value is None:
            raise ProxyError(400, f"'{name}' is required", "missing_field", name)
        if not isinstance(value, types):
            kinds = " or ".join("a string" if t is str else "a list" for t in types)
            raise ProxyError(400, f"'{name}' must be {kinds}", "invalid_type", name)
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=bool(stream),
        conversation_key=_conversation_key(endpoint, body),
    )


def _conversation_key(endpoint: str, body: dict[str, Any]) -> str | None:
    """A session key for clients that send none: the conversation's opening messages.

    Up to and including the first user message, which every later turn of the same
    conversation repeats verbatim while other conversations sharing a system prompt differ.
    """
    if endpoint not in ("chat", "messages"):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    opening = []
    for m in messages:
        opening.append(m)
        if isinstance(m, dict) and m.get("role") == "user":
            break
    try:
        blob = orjson.dumps([body.get("system"), opening])
    except TypeError:
        return None
    return f"conv:{xxhash.xxh3_64_hexdigest(blob)}"
