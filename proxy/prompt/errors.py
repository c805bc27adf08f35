"""The one error type the prompt package raises for bad input (the proxy answers 400)."""


class PromptError(ValueError):
    """A request body or template the proxy cannot turn into a routing key."""


class TemplateRenderError(PromptError):
    """A chat template failed on a request (it raised, or hit a value it cannot handle)."""
