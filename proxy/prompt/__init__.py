"""Prompt package: a request body -> the text the engine sees -> chained block hashes.

Pure apart from reading configured template files at startup.
"""

from proxy.prompt.blocks import block_hashes, salt_seed
from proxy.prompt.errors import PromptError, TemplateRenderError
from proxy.prompt.extract import ENDPOINTS, routing_text
from proxy.prompt.messages import messages as chat_messages
from proxy.prompt.registry import PromptConfig, TemplateRegistry
from proxy.prompt.render import ChatTemplate, TemplateRaised
from proxy.prompt.sources import LoadedTemplate, TemplateSource, load_tokenizer_config
from proxy.prompt.templates import BUILTINS, FALLBACK, builtin_name_for

__all__ = [
    "BUILTINS",
    "ENDPOINTS",
    "FALLBACK",
    "ChatTemplate",
    "LoadedTemplate",
    "PromptConfig",
    "PromptError",
    "TemplateRaised",
    "TemplateRegistry",
    "TemplateRenderError",
    "TemplateSource",
    "block_hashes",
    "builtin_name_for",
    "chat_messages",
    "load_tokenizer_config",
    "routing_text",
    "salt_seed",
]
