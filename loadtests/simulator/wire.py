"""Answer bodies and SSE events, in each engine's own shape.

Chat completions follow the captured vLLM 0.32 and llama.cpp samples byte for byte in key
set and order; SGLang's shape comes from its source. Usage always carries
``prompt_tokens_details.cached_tokens`` (vLLM prints it with
``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``). Completions,
Responses and Anthropic Messages are minimal but well-formed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

LLAMACPP_FINGERPRINT = "b1-sim"
VLLM_FINGERPRINT = "vllm-0.32.0-sim"
DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prompt_ms: float
    predicted_ms: float


@dataclass(slots=True)
class ReplyMeta:
    id: str
    created: int
    model: str
    dialect: str


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_event(name: str, obj: Any) -> bytes:
    return b"event: " + name.encode() + b"\n" + sse(obj)


class Wire(Protocol):
    def head(self, m: ReplyMeta, u: Usage) -> list[bytes]: ...
    def token(self, m: ReplyMeta, text: str) -> bytes: ...
    def tail(self, m: ReplyMeta, text: str, u: Usage, include_usage: bool) -> list[bytes]: ...
    def body(self, m: ReplyMeta, text: str, u: Usage) -> dict[str, Any]: ...


def usage_json(dialect: str, u: Usage) -> dict[str, Any]:
    total = u.prompt_tokens + u.completion_tokens
    details = {"cached_tokens": u.cached_tokens}
    if dialect == "llamacpp":
        return {
            "completion_tokens": u.completion_tokens,
            "prompt_tokens": u.prompt_tokens,
            "total_tokens": total,
            "prompt_tokens_details": details,
        }
    return {
        "prompt_tokens": u.prompt_tokens,
        "total_tokens": total,
        "completion_tokens": u.completion_tokens,
        "prompt_tokens_details": details,
    }


def llamacpp_timings(u: Usage) -> dict[str, Any]:
    prompt_n = u.prompt_tokens - u.cached_tokens
    return {
        "cache_n": u.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": u.prompt_ms,
        "prompt_per_token_ms": u.prompt_ms / max(prompt_n, 1),
        "prompt_per_second": 1000 * prompt_n / u.prompt_ms if u.prompt_ms > 0 else 0.0,
        "predicted_n": u.completion_tokens,
        "predicted_ms": u.predicted_ms,
        "predicted_per_token_ms": u.predicted_ms / max(u.completion_tokens, 1),
        "predicted_per_second": (
            1000 * u.completion_tokens / u.predicted_ms if u.predicted_ms > 0 else 0.0
        ),
    }


class ChatWire:
    """OpenAI chat completions."""

    def head(self, m: ReplyMeta, u: Usage) -> list[bytes]:
        if m.dialect == "llamacpp":
            choice = {"finish_reason": None, "index": 0, "delta": _role_delta(None)}
            return [sse(self._llamacpp_chunk(m, [choice]))]
        if m.dialect == "sglang":
            delta = {**_role_delta(""), "reasoning_content": None, "tool_calls": None}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            return [sse(self._sglang_chunk(m, [{**choice, "matched_stop": None}]))]
        choice = {"index": 0, "delta": _role_delta(""), "logprobs": None, "finish_reason": None}
        chunk = {**self._chunk(m, [choice]), "prompt_token_ids": None, "prompt_text": None}
        return [sse(chunk)]

    def token(self, m: ReplyMeta, text: str) -> bytes:
        if m.dialect == "llamacpp":
            choice = {"finish_reason": None, "index": 0, "delta": {"content": text}}
            return sse(self._llamacpp_chunk(m, [choice]))
        if m.dialect == "sglang":
            delta = {"role": None, "content": text, "reasoning_content": None, "tool_calls": None}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            return sse(self._sglang_chunk(m, [{**choice, "matched_stop": None}]))
        choice = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": None,
        }
        return sse(self._chunk(m, [choice]))

    def tail(self, m: ReplyMeta, text: str, u: Usage, include_usage: bool) -> list[bytes]:
        usage = usage_json(m.dialect, u)
        if m.dialect == "llamacpp":
            final = self._llamacpp_chunk(m, [{"finish_reason": "length", "index": 0, "delta": {}}])
            events = [final]
            if include_usage:
                events.append({**self._llamacpp_chunk(m, []), "usage": usage})
            events[-1]["timings"] = llamacpp_timings(u)
            return [*map(sse, events), DONE]
        if m.dialect == "sglang":
            delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length"}
            events = [self._sglang_chunk(m, [{**choice, "matched_stop": None}])]
            if include_usage:
                events.append({**self._sglang_chunk(m, []), "usage": usage})
            return [*map(sse, events), DONE]
        choice = {
            "index": 0,
            "delta": {"content": ""},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": None,
        }
        events = [self._chunk(m, [choice])]
        if include_usage:
            events.append(
                {**self._chunk(m, []), "usage": usage, "system_fingerprint": VLLM_FINGERPRINT}
            )
        return [*map(sse, events), DONE]

    def body(self, m: ReplyMeta, text: str, u: Usage) -> dict[str, Any]:
        usage = usage_json(m.dialect, u)
        if m.dialect == "llamacpp":
            message = {"role": "assistant", "content": text}
            return {
                "choices": [{"finish_reason": "length", "index": 0, "message": message}],
                "created": m.created,
                "model": m.model,
                "system_fingerprint": LLAMACPP_FINGERPRINT,
                "object": "chat.completion",
                "usage": usage,
                "id": m.id,
                "timings": llamacpp_timings(u),
            }
        if m.dialect == "sglang":
            message = {
                "role": "assistant",
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "length",
                "matched_stop": None,
            }
            return {**_head(m, "chat.completion"), "choices": [choice], "usage": usage}
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
        }
        return {
            **_head(m, "chat.completion"),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": VLLM_FINGERPRINT,
            "usage": {**usage, "completion_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    @staticmethod
    def _chunk(m: ReplyMeta, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**_head(m, "chat.completion.chunk"), "choices": choices}

    @staticmethod
    def _sglang_chunk(m: ReplyMeta, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**_head(m, "chat.completion.chunk"), "choices": choices, "usage": None}

    @staticmethod
    def _llamacpp_chunk(m: ReplyMeta, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "choices": choices,
            "created": m.created,
            "id": m.id,
            "model": m.model,
            "system_fingerprint": LLAMACPP_FINGERPRINT,
            "object": "chat.completion.chunk",
        }


class CompletionWire:
    """OpenAI legacy completions (same shape for every dialect, plus llama.cpp timings)."""

    def head(self, m: ReplyMeta, u: Usage) -> list[bytes]:
        return []

    def token(self, m: ReplyMeta, text: str) -> bytes:
        return sse(self._chunk(m, text, None))

    def tail(self, m: ReplyMeta, text: str, u: Usage, include_usage: bool) -> list[bytes]:
        events = [self._chunk(m, "", "length")]
        if include_usage:
            events.append(
                {**_head(m, "text_completion"), "choices": [], "usage": usage_json(m.dialect, u)}
            )
        if m.dialect == "llamacpp":
            events[-1]["timings"] = llamacpp_timings(u)
        return [*map(sse, events), DONE]

    def body(self, m: ReplyMeta, text: str, u: Usage) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        out = {
            **_head(m, "text_completion"),
            "choices": [choice],
            "usage": usage_json(m.dialect, u),
        }
        if m.dialect == "llamacpp":
            out["timings"] = llamacpp_timings(u)
        return out

    @staticmethod
    def _chunk(m: ReplyMeta, text: str, finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**_head(m, "text_completion"), "choices": [choice]}


class ResponsesWire:
    """OpenAI Responses API: one output message of one text part."""

    def head(self, m: ReplyMeta, u: Usage) -> list[bytes]:
        response = {**self._response(m, [], u), "status": "in_progress"}
        return [sse_event("response.created", {"type": "response.created", "response": response})]

    def token(self, m: ReplyMeta, text: str) -> bytes:
        event = {
            "type": "response.output_text.delta",
            "item_id": "msg_" + m.id,
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        }
        return sse_event(event["type"], event)

    def tail(self, m: ReplyMeta, text: str, u: Usage, include_usage: bool) -> list[bytes]:
        event = {"type": "response.completed", "response": self.body(m, text, u)}
        return [sse_event(event["type"], event)]

    def body(self, m: ReplyMeta, text: str, u: Usage) -> dict[str, Any]:
        message = {
            "type": "message",
            "id": "msg_" + m.id,
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        return self._response(m, [message], u)

    @staticmethod
    def _response(m: ReplyMeta, output: list[dict[str, Any]], u: Usage) -> dict[str, Any]:
        return {
            "id": "resp_" + m.id,
            "object": "response",
            "created_at": m.created,
            "status": "completed",
            "model": m.model,
            "output": output,
            "usage": {
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            },
        }


class MessagesWire:
    """Anthropic Messages API: one text block; every reply stops at max_tokens."""

    def head(self, m: ReplyMeta, u: Usage) -> list[bytes]:
        message = {**self._message(m, [], u), "stop_reason": None}
        block = {"type": "content_block_start", "index": 0, "content_block": _text_block("")}
        return [
            sse_event("message_start", {"type": "message_start", "message": message}),
            sse_event("content_block_start", block),
        ]

    def token(self, m: ReplyMeta, text: str) -> bytes:
        delta = {"type": "text_delta", "text": text}
        return sse_event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )

    def tail(self, m: ReplyMeta, text: str, u: Usage, include_usage: bool) -> list[bytes]:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
            "usage": {"output_tokens": u.completion_tokens},
        }
        return [
            sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            sse_event("message_delta", delta),
            sse_event("message_stop", {"type": "message_stop"}),
        ]

    def body(self, m: ReplyMeta, text: str, u: Usage) -> dict[str, Any]:
        return self._message(m, [_text_block(text)], u)

    @staticmethod
    def _message(m: ReplyMeta, content: list[dict[str, Any]], u: Usage) -> dict[str, Any]:
        return {
            "id": "msg_" + m.id,
            "type": "message",
            "role": "assistant",
            "model": m.model,
            "content": content,
            "stop_reason": "max_tokens",
            "stop_sequence": None,
            "usage": {
                "input_tokens": u.prompt_tokens - u.cached_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": u.cached_tokens,
                "output_tokens": u.completion_tokens,
            },
        }


def _head(m: ReplyMeta, obj: str) -> dict[str, Any]:
    return {"id": m.id, "object": obj, "created": m.created, "model": m.model}


def _role_delta(content: str | None) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
