"""Request bodies of the generation APIs, turned into prompt text and sampling limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadtests.simulator.prompt import ChatRenderer, PromptError, content_text


@dataclass(slots=True)
class GenRequest:
    prompt_text: str
    max_tokens: int
    stream: bool
    include_usage: bool
    model: str | None


def parse_chat(body: Any, renderer: ChatRenderer, default_max_tokens: int) -> GenRequest:
    """POST /v1/chat/completions; ``n`` and sampling parameters are ignored."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise PromptError("'messages' must be a list")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise PromptError("'tools' must be a list")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return _request(body, renderer.render(messages, tools), limit, default_max_tokens)


def parse_completion(body: Any, default_max_tokens: int) -> GenRequest:
    """POST /v1/completions with a single string prompt."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise PromptError("'prompt' must be a string (token ids and batches are not simulated)")
    return _request(body, prompt, body.get("max_tokens"), default_max_tokens)


def parse_responses(body: Any, renderer: ChatRenderer, default_max_tokens: int) -> GenRequest:
    """POST /v1/responses: ``instructions`` and ``input`` rendered as a chat."""
    body = _object(body)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        messages.append({"role": "system", "content": content_text(instructions)})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            if not isinstance(item, dict):
                raise PromptError("'input' items must be objects")
            messages.append({"role": item.get("role", "user"), "content": item.get("content")})
    else:
        raise PromptError("'input' must be a string or a list of messages")
    limit = body.get("max_output_tokens")
    return _request(body, renderer.render(messages, None), limit, default_max_tokens)


def parse_messages(body: Any, renderer: ChatRenderer, default_max_tokens: int) -> GenRequest:
    """POST /v1/messages (Anthropic): ``system`` and ``messages`` rendered as a chat."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise PromptError("'messages' must be a list")
    system = body.get("system")
    if system is not None:
        messages = [{"role": "system", "content": content_text(system)}, *messages]
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise PromptError("'tools' must be a list")
    prompt = renderer.render(messages, tools)
    request = _request(body, prompt, body.get("max_tokens"), default_max_tokens)
    request.include_usage = True
    return request


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise PromptError("the request body must be a JSON object")
    return body


def _request(body: dict[str, Any], prompt: str, limit: Any, default: int) -> GenRequest:
    if limit is None:
        limit = default
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise PromptError("the token limit must be a positive integer")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise PromptError("'stream' must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise PromptError("'stream_options' must be an object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise PromptError("'model' must be a string")
    return GenRequest(
        prompt_text=prompt,
        max_tokens=limit,
        stream=stream,
        include_usage=options.get("include_usage") is True,
        model=model,
    )
