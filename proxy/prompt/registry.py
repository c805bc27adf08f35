"""Which chat template each model is rendered with, compiled once.

Precedence: the template configured for the model, then the one its backend reports at run
time (llama.cpp ``/props``), then a built-in chosen by model-name pattern, then the generic
fallback. A template that fails on a request (it raises, or meets a shape it cannot handle)
does not fail the request: the key falls back to the generic rendering and the failure is
counted in ``template_errors``, because the proxy's copy of a template may be stricter than
the engine's and routing must go on either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import cache
from typing import Any

from proxy.prompt import messages as chat
from proxy.prompt.errors import PromptError, TemplateRenderError
from proxy.prompt.render import ChatTemplate
from proxy.prompt.sources import LoadedTemplate, TemplateSource, load_source
from proxy.prompt.templates import FALLBACK, builtin_name_for, builtin_templates

log = logging.getLogger(__name__)

# Model names come from requests; the memo of name -> template is cleared when it gets this big.
_MEMO_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class PromptConfig:
    """Prompt settings from YAML: block size and cap for hashing, templates per model."""

    block_chars: int = 128
    max_blocks: int = 8192
    templates: Mapping[str, TemplateSource] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.block_chars < 1:
            raise PromptError(f"block_chars must be at least 1, got {self.block_chars}")
        if self.max_blocks < 1:
            raise PromptError(f"max_blocks must be at least 1, got {self.max_blocks}")


def _compile(name: str, loaded: LoadedTemplate) -> ChatTemplate:
    return ChatTemplate(name, loaded.source, loaded.bos_token, loaded.eos_token)


@cache
def _builtin(name: str) -> ChatTemplate:
    """A built-in, compiled on first use (compiling all of them costs most of a second) and
    shared by every registry: a ChatTemplate is immutable."""
    return _compile(name, builtin_templates()[name])


class TemplateRegistry:
    """Chooses and caches each model's ``ChatTemplate``; reads template files only here."""

    def __init__(self, config: PromptConfig) -> None:
        self.config = config
        self.fallback = _builtin(FALLBACK)
        self._configured = {
            model: _compile(f"config:{model}", load_source(source, builtin_templates()))
            for model, source in config.templates.items()
        }
        self._backend: dict[str, ChatTemplate] = {}
        self._memo: dict[str, ChatTemplate] = {}
        self.template_errors: dict[str, int] = {}

    def set_backend_template(
        self, model: str, source: str, bos_token: str = "", eos_token: str = ""
    ) -> None:
        """Use the template a backend reports for ``model`` (unless config names one).

        Raises ``PromptError`` if it does not compile; setting the same one again is free.
        """
        current = self._backend.get(model)
        if current is not None and (current.source, current.bos_token, current.eos_token) == (
            source,
            bos_token,
            eos_token,
        ):
            return
        self._backend[model] = ChatTemplate(f"backend:{model}", source, bos_token, eos_token)
        self._memo.pop(model, None)

    def template_for(self, model: str) -> ChatTemplate:
        """Config, then backend, then built-in by name pattern, then the fallback."""
        template = self._memo.get(model)
        if template is None:
            template = self._configured.get(model) or self._backend.get(model)
            if template is None:
                name = builtin_name_for(model)
                template = self.fallback if name is None else _builtin(name)
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[model] = template
        return template

    def render_conversation(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        today: date | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The routing key text of a conversation: rendered without the generation prompt,
        so each turn's key is a prefix of the next turn's."""
        template = self.template_for(model)
        kwargs = template_kwargs or {}
        try:
            return template.render(messages, tools, False, today, **kwargs)
        except TemplateRenderError as exc:
            if template is self.fallback:
                raise
            self._count_error(template, exc)
        return self.fallback.render(messages, tools, False, today)

    def render_chat(
        self,
        model: str,
        messages: Any,
        tools: Sequence[Mapping[str, Any]] | None = None,
        today: date | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """``render_conversation`` for a chat request's messages as sent: a fast renderer
        reads them as they are; otherwise they are normalized (``PromptError`` for a
        malformed one) and rendered as usual."""
        template = self.template_for(model)
        text = template.try_render_request(messages, tools, False, today, **(template_kwargs or {}))
        if text is not None:
            return text
        return self.render_conversation(
            model, chat.messages(messages), tools, today, template_kwargs
        )

    def _count_error(self, template: ChatTemplate, exc: TemplateRenderError) -> None:
        count = self.template_errors.get(template.name, 0)
        if count == 0:
            log.warning("%s; routing on the generic rendering instead", exc)
        self.template_errors[template.name] = count + 1
