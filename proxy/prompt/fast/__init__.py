"""Fast renderers: pure-Python equivalents of the built-in chat templates met most often
(ChatML, Qwen2.5, Qwen3, Llama 3.1/3.3, Llama 3.2), byte-identical to the Jinja render.

Rendering a long agent conversation through Jinja costs milliseconds per request; these
build the same text with a few string operations per message, from canonical messages
(``ChatTemplate.render``) or straight from a chat request's messages as sent, so that the
request path skips building normalized copies too (``ChatTemplate.try_render_request``,
``TemplateRegistry.render_chat``). A template gets one when the
text Jinja compiles from its source (Jinja drops one trailing line break and reads every
line break as ``\\n``) is exactly the text a renderer was written for, identified by its
SHA-256, wherever the source came from: built-in, configuration, or a backend's ``/props``.
Editing a built-in template file therefore turns its fast renderer off rather than making
it wrong. A fast renderer that meets anything it does not reproduce exactly (an unknown
role, an odd content type, a template variable it does not model) raises ``Unsupported``,
and the Jinja template renders that request.
"""

from __future__ import annotations

import hashlib
import re

from proxy.prompt.fast import chatml, llama3, qwen2_5, qwen3
from proxy.prompt.fast.common import FastRenderer, Unsupported

__all__ = ["FastRenderer", "Unsupported", "fast_renderer"]

# SHA-256 of the compiled text of each built-in template (builtin/<name>.jinja).
_BY_SHA256: dict[str, FastRenderer] = {
    # chatml
    "fcf7a096fe99a48fd9ad2b250bf9237e96e8f48bffec1c7ea4d3f225176cd40e": chatml.RENDERER,
    # qwen2_5
    "55b2f4a26ac9ee719330a61a0c39d9e538b0e9322212f048326318cff4f8674a": qwen2_5.RENDERER,
    # qwen3
    "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": qwen3.RENDERER,
    # llama3 (3.1, 3.3)
    "93c0e9aa3629bbd77e68dbc0f5621f6e6b23aa8d74b932595cdb8d64684526d7": llama3.RENDERER_3_1,
    # llama3_2
    "d82792f95932f1c9cef5c4bd992f171225e3bf8c7b609b4557c9e1ec96be819f": llama3.RENDERER_3_2,
}

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def compiled_text(source: str) -> str:
    """The text Jinja's lexer reads from a template source (``Lexer.tokeniter``)."""
    lines = _LINE_BREAK.split(source)
    if lines[-1] == "":
        del lines[-1]
    return "\n".join(lines)


def fast_renderer(source: str) -> FastRenderer | None:
    """The fast renderer of a template source, or None where only Jinja renders it."""
    digest = hashlib.sha256(compiled_text(source).encode("utf-8", "surrogatepass")).hexdigest()
    return _BY_SHA256.get(digest)
