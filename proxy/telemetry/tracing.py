"""OpenTelemetry traces: a server span per request, a client span per upstream attempt.

The proxy continues the caller's W3C trace (``traceparent`` in the client request) and
hands it on to the engine (vLLM continues it when started with ``--otlp-traces-endpoint``),
so one trace runs client -> proxy -> engine.
``Tracing`` owns its TracerProvider (never the global one), so several apps or tests in one
process do not share spans. With ``exporter: none`` no provider exists and every request gets
the shared ``NO_TRACE`` whose methods do nothing: the request path pays a few method calls.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.config import TracingConfig

if TYPE_CHECKING:
    from proxy.backends.pool import Backend
    from proxy.forward import ForwardResult
    from proxy.routing.views import Decision

OTLP_TIMEOUT_S = 5.0
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
# Proxy endpoint -> GenAI semantic-convention operation name.
OPERATIONS = {
    "chat": "chat",
    "completions": "text_completion",
    "responses": "chat",
    "messages": "chat",
    "embeddings": "embeddings",
}
_PROPAGATOR = TraceContextTextMapPropagator()


class RequestTrace:
    """The spans of one request. This base class is the no-op used when tracing is off."""

    __slots__ = ()

    def set_decision(self, model: str, policy: str, decision: Decision, prompt_blocks: int) -> None:
        """Name the span after the model and record why routing chose what it chose."""

    def upstream_headers(
        self, headers: Mapping[str, str], backend: Backend, method: str, url: str
    ) -> Mapping[str, str]:
        """Start the client span of one upstream attempt; the headers to send with it."""
        return headers

    def upstream_failed(self, kind: str, status: int = 0) -> None:
        """The current attempt failed before the first byte (it will be retried or not)."""

    def end(self, status: int, result: ForwardResult) -> None:
        """The request is over: close the open client span, then the server span."""


NO_TRACE = RequestTrace()


class LiveTrace(RequestTrace):
    """Spans of a traced request; the server span is the parent of every attempt."""

    __slots__ = ("_attempt", "_client", "_matched", "_model", "_op", "_server", "_tracer")

    def __init__(self, tracer: Tracer, server: Span, op: str | None) -> None:
        self._tracer = tracer
        self._server = server
        self._op = op
        self._model = ""
        self._matched: dict[str, int] = {}
        self._client: Span | None = None
        self._attempt = 0

    def set_decision(self, model: str, policy: str, decision: Decision, prompt_blocks: int) -> None:
        self._model = model
        self._matched = decision.matched_blocks
        span = self._server
        if not span.is_recording():
            return
        if model:
            span.update_name(_span_name(self._op, model, span.name))
            span.set_attribute("gen_ai.request.model", model)
        chosen = decision.ranked[0] if decision.ranked else ""
        span.set_attributes(
            {
                "prefix_proxy.policy": policy,
                "prefix_proxy.decision.reason": decision.reason,
                "prefix_proxy.decision.backend": chosen,
                "prefix_proxy.decision.candidates": len(decision.ranked),
                "prefix_proxy.prompt_blocks": prompt_blocks,
                "prefix_proxy.decision.matched_blocks": decision.matched_blocks.get(chosen, 0),
            }
        )

    def upstream_headers(
        self, headers: Mapping[str, str], backend: Backend, method: str, url: str
    ) -> Mapping[str, str]:
        self._close_client()
        self._attempt += 1
        host, port = _address(backend.url)
        attributes: dict[str, str | int] = {
            "http.request.method": method,
            "url.full": url,
            "server.address": host,
            "server.port": port,
            "prefix_proxy.backend": backend.url,
        }
        if self._attempt > 1:
            attributes["http.request.resend_count"] = self._attempt - 1
        if self._op is not None:
            attributes["gen_ai.operation.name"] = self._op
        if self._model:
            attributes["gen_ai.request.model"] = self._model
        if backend.dialect:
            attributes["gen_ai.system"] = backend.dialect
        self._client = client = self._tracer.start_span(
            _span_name(self._op, self._model, method),
            context=trace.set_span_in_context(self._server),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        out = {k: v for k, v in headers.items() if k.lower() not in TRACE_HEADERS}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(client))
        return out

    def upstream_failed(self, kind: str, status: int = 0) -> None:
        client = self._client
        if client is None:
            return
        if status:
            client.set_attribute("http.response.status_code", status)
        client.set_attribute("error.type", kind)
        client.set_status(Status(StatusCode.ERROR, kind))
        client.end()
        self._client = None

    def end(self, status: int, result: ForwardResult) -> None:
        backend = result.backend
        if self._client is not None:
            if backend is None:
                self.upstream_failed("client_aborted" if result.client_aborted else "abandoned")
            else:
                if result.status:
                    self._client.set_attribute("http.response.status_code", result.status)
                if result.error_kind == "midstream":
                    self._client.set_attribute("error.type", "midstream")
                    self._client.set_status(Status(StatusCode.ERROR, "midstream"))
                self._close_client()
        span = self._server
        if span.is_recording():
            attributes: dict[str, str | int | bool] = {
                "prefix_proxy.attempts": result.attempts,
                "prefix_proxy.retries": max(0, result.attempts - 1),
                "prefix_proxy.client_aborted": result.client_aborted,
            }
            if status:
                attributes["http.response.status_code"] = status
            if backend is not None:
                attributes["prefix_proxy.backend"] = backend.url
                attributes["prefix_proxy.matched_blocks"] = self._matched.get(backend.url, 0)
                if backend.dialect:
                    attributes["gen_ai.system"] = backend.dialect
            if result.error_kind:
                attributes["prefix_proxy.upstream_error"] = result.error_kind
            span.set_attributes(attributes)
            if status >= 500:
                span.set_attribute("error.type", result.error_kind or str(status))
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.end()
            self._client = None


class Tracing:
    """Builds request traces; ``enabled`` is False (and everything a no-op) when off."""

    def __init__(self, provider: TracerProvider | None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("prefix_proxy") if provider is not None else None

    @classmethod
    def from_config(cls, cfg: TracingConfig, exporter: SpanExporter | None = None) -> Tracing:
        """``exporter`` replaces the configured one (tests pass an in-memory exporter)."""
        if exporter is None:
            if cfg.exporter == "none":
                return cls(None)
            exporter = _exporter(cfg)
        provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)),
            resource=Resource.create({SERVICE_NAME: cfg.service_name}),
            shutdown_on_exit=False,
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start_request(
        self, headers: Mapping[str, str], endpoint: str, method: str, path: str
    ) -> RequestTrace:
        """Open the server span, continuing the caller's trace when it sent a traceparent."""
        tracer = self._tracer
        if tracer is None:
            return NO_TRACE
        parent = _PROPAGATOR.extract(headers) if "traceparent" in headers else None
        op = OPERATIONS.get(endpoint)
        attributes: dict[str, str] = {"http.request.method": method, "url.path": path}
        if op is not None:
            attributes["gen_ai.operation.name"] = op
        span = tracer.start_span(
            op or method, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return LiveTrace(tracer, span, op)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export every finished span now (blocking); True when all made it."""
        if self._provider is None:
            return True
        return self._provider.force_flush(int(timeout_s * 1000))

    async def shutdown(self) -> None:
        """Export what is left and stop the exporter thread, off the event loop."""
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)


def _exporter(cfg: TracingConfig) -> SpanExporter:
    if cfg.exporter == "console":
        # sys.stdout as it is now: the exporter's default was bound when the SDK was imported.
        return ConsoleSpanExporter(service_name=cfg.service_name, out=sys.stdout)
    return OTLPSpanExporter(endpoint=_otlp_traces_url(cfg.endpoint), timeout=OTLP_TIMEOUT_S)


def _otlp_traces_url(endpoint: str | None) -> str | None:
    """A bare collector address (``http://otel:4318``) gets the OTLP/HTTP traces path."""
    if endpoint is None:
        return None
    if urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def _span_name(op: str | None, model: str, fallback: str) -> str:
    if op is None:
        return fallback
    return f"{op} {model}" if model else op


@lru_cache(maxsize=1024)
def _address(url: str) -> tuple[str, int]:
    """Host and port of a backend URL for ``server.address``/``server.port`` (0: unknown)."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return parts.hostname or "", port
