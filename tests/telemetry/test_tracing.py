"""Tracing: span names, attributes, parent/child links, W3C traceparent in and out."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.backends.pool import Backend
from proxy.config import TracingConfig
from proxy.forward import ForwardResult
from proxy.routing.views import Decision
from proxy.telemetry.tracing import NO_TRACE, Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
CHAT_PATH = "/v1/chat/completions"

A = Backend(url="http://127.0.0.1:8001", dialect="vllm")
B = Backend(url="http://127.0.0.1:8002", dialect="llamacpp")
DECISION = Decision(ranked=[A.url, B.url], reason="prefix", matched_blocks={A.url: 6, B.url: 2})


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest_asyncio.fixture
async def tracing(exporter: InMemorySpanExporter) -> AsyncIterator[Tracing]:
    t = Tracing.from_config(TracingConfig(service_name="proxy-under-test"), exporter)
    yield t
    await t.shutdown()


def finished(tracing: Tracing, exporter: InMemorySpanExporter) -> dict[SpanKind, list]:
    assert tracing.force_flush()
    by_kind: dict[SpanKind, list[ReadableSpan]] = {SpanKind.SERVER: [], SpanKind.CLIENT: []}
    for span in exporter.get_finished_spans():
        by_kind[span.kind].append(span)
    return by_kind


def ids(traceparent: str) -> tuple[str, str, str]:
    m = TRACEPARENT.match(traceparent)
    assert m, traceparent
    return m.group(1), m.group(2), m.group(3)


def served(backend: Backend, attempts: int = 1, **kw: object) -> ForwardResult:
    return ForwardResult(backend=backend, status=200, attempts=attempts, **kw)


async def test_off_is_a_shared_no_op():
    tracing = Tracing.from_config(TracingConfig(exporter="none"))
    assert not tracing.enabled
    trace = tracing.start_request({"traceparent": CALLER}, "chat", "POST", CHAT_PATH)
    assert trace is NO_TRACE
    headers = {"traceparent": CALLER}
    assert trace.upstream_headers(headers, A, "POST", A.url + CHAT_PATH) is headers
    trace.set_decision("m", "default", DECISION, 8)
    trace.upstream_failed("connect", 0)
    trace.end(200, served(A))
    assert tracing.force_flush()
    await tracing.shutdown()


async def test_continues_the_callers_trace_and_hands_it_on(tracing, exporter):
    incoming = CIMultiDict({"Traceparent": CALLER, "tracestate": "vendor=abc"})
    trace = tracing.start_request(incoming, "chat", "POST", CHAT_PATH)
    trace.set_decision("sim-model", "default", DECISION, 8)
    sent = trace.upstream_headers(
        {"Content-Type": "application/json", "traceparent": CALLER, "TraceState": "vendor=abc"},
        A,
        "POST",
        A.url + CHAT_PATH,
    )
    trace.end(200, served(A))

    assert sorted(k.lower() for k in sent) == ["content-type", "traceparent", "tracestate"]
    assert sent["tracestate"] == "vendor=abc"
    trace_id, parent_span, flags = ids(sent["traceparent"])
    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    (client,) = spans[SpanKind.CLIENT]
    assert f"{server.context.trace_id:032x}" == trace_id == TRACE_ID
    assert f"{server.parent.span_id:016x}" == CALLER_SPAN
    assert server.parent.is_remote
    assert client.parent.span_id == server.context.span_id
    assert f"{client.context.span_id:016x}" == parent_span
    assert flags == "01"
    assert server.resource.attributes["service.name"] == "proxy-under-test"


async def test_server_span_names_the_operation_and_the_routing(tracing, exporter):
    trace = tracing.start_request({}, "chat", "POST", CHAT_PATH)
    trace.set_decision("sim-model", "agent-fleet", DECISION, 8)
    trace.upstream_headers({}, A, "POST", A.url + CHAT_PATH)
    trace.end(200, served(A))

    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    (client,) = spans[SpanKind.CLIENT]
    assert server.parent is None
    assert server.name == "chat sim-model"
    assert server.status.status_code is StatusCode.UNSET
    assert dict(server.attributes) == {
        "http.request.method": "POST",
        "url.path": CHAT_PATH,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "sim-model",
        "gen_ai.system": "vllm",
        "http.response.status_code": 200,
        "prefix_proxy.policy": "agent-fleet",
        "prefix_proxy.decision.reason": "prefix",
        "prefix_proxy.decision.backend": A.url,
        "prefix_proxy.decision.candidates": 2,
        "prefix_proxy.decision.matched_blocks": 6,
        "prefix_proxy.prompt_blocks": 8,
        "prefix_proxy.backend": A.url,
        "prefix_proxy.matched_blocks": 6,
        "prefix_proxy.attempts": 1,
        "prefix_proxy.retries": 0,
        "prefix_proxy.client_aborted": False,
    }
    assert client.name == "chat sim-model"
    assert dict(client.attributes) == {
        "http.request.method": "POST",
        "url.full": A.url + CHAT_PATH,
        "server.address": "127.0.0.1",
        "server.port": 8001,
        "prefix_proxy.backend": A.url,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "sim-model",
        "gen_ai.system": "vllm",
        "http.response.status_code": 200,
    }


async def test_each_retry_is_its_own_client_span(tracing, exporter):
    trace = tracing.start_request({"traceparent": CALLER}, "completions", "POST", "/v1/completions")
    trace.set_decision("m", "default", DECISION, 3)
    first = trace.upstream_headers({}, A, "POST", A.url + "/v1/completions")
    trace.upstream_failed("status_5xx", 503)
    second = trace.upstream_headers({}, B, "POST", B.url + "/v1/completions")
    trace.end(200, served(B, attempts=2, error_kind="status_5xx", retries=[B.url]))

    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    failed, ok = sorted(spans[SpanKind.CLIENT], key=lambda s: s.start_time)
    assert server.name == "text_completion m"
    assert ids(first["traceparent"])[1] == f"{failed.context.span_id:016x}"
    assert ids(second["traceparent"])[1] == f"{ok.context.span_id:016x}"
    assert failed.parent.span_id == ok.parent.span_id == server.context.span_id
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "status_5xx"
    assert failed.attributes["http.response.status_code"] == 503
    assert "http.request.resend_count" not in failed.attributes
    assert ok.attributes["http.request.resend_count"] == 1
    assert ok.attributes["server.port"] == 8002
    assert ok.status.status_code is StatusCode.UNSET
    assert server.attributes["prefix_proxy.backend"] == B.url
    assert server.attributes["prefix_proxy.matched_blocks"] == 2
    assert server.attributes["prefix_proxy.attempts"] == 2
    assert server.attributes["prefix_proxy.retries"] == 1
    assert server.attributes["prefix_proxy.upstream_error"] == "status_5xx"
    assert server.attributes["gen_ai.system"] == "llamacpp"


async def test_upstream_failure_marks_the_server_span_as_error(tracing, exporter):
    trace = tracing.start_request({}, "chat", "POST", CHAT_PATH)
    trace.set_decision("m", "default", DECISION, 1)
    trace.upstream_headers({}, A, "POST", A.url + CHAT_PATH)
    trace.upstream_failed("connect")
    trace.end(502, ForwardResult(attempts=1, error_kind="connect"))

    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    (client,) = spans[SpanKind.CLIENT]
    assert client.attributes["error.type"] == "connect"
    assert "http.response.status_code" not in client.attributes
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes["error.type"] == "connect"
    assert server.attributes["http.response.status_code"] == 502
    assert "prefix_proxy.backend" not in server.attributes


async def test_client_leaving_closes_the_open_attempt(tracing, exporter):
    trace = tracing.start_request({}, "chat", "POST", CHAT_PATH)
    trace.upstream_headers({}, A, "POST", A.url + CHAT_PATH)
    trace.end(0, ForwardResult(attempts=1, client_aborted=True))

    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    (client,) = spans[SpanKind.CLIENT]
    assert client.attributes["error.type"] == "client_aborted"
    assert server.attributes["prefix_proxy.client_aborted"] is True
    assert "http.response.status_code" not in server.attributes
    assert server.status.status_code is StatusCode.UNSET


async def test_midstream_failure_marks_the_committed_attempt(tracing, exporter):
    trace = tracing.start_request({}, "chat", "POST", CHAT_PATH)
    trace.upstream_headers({}, A, "POST", A.url + CHAT_PATH)
    trace.end(200, served(A, error_kind="midstream"))

    spans = finished(tracing, exporter)
    (client,) = spans[SpanKind.CLIENT]
    assert client.attributes["error.type"] == "midstream"
    assert client.attributes["http.response.status_code"] == 200
    assert client.status.status_code is StatusCode.ERROR


async def test_rejected_before_routing_still_has_a_span(tracing, exporter):
    trace = tracing.start_request({}, "embeddings", "POST", "/v1/embeddings")
    trace.end(400, ForwardResult())

    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    assert spans[SpanKind.CLIENT] == []
    assert server.name == "embeddings"
    assert server.attributes["http.response.status_code"] == 400
    assert server.attributes["prefix_proxy.attempts"] == 0
    assert server.status.status_code is StatusCode.UNSET


async def test_passthrough_endpoints_are_named_by_method(tracing, exporter):
    trace = tracing.start_request({}, "other", "GET", "/v1/files/abc")
    trace.set_decision("", "default", DECISION, 0)
    trace.upstream_headers({}, A, "GET", A.url + "/v1/files/abc")
    trace.end(200, served(A))

    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    (client,) = spans[SpanKind.CLIENT]
    assert server.name == client.name == "GET"
    assert "gen_ai.operation.name" not in server.attributes
    assert "gen_ai.request.model" not in client.attributes


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-" + "a" * 500,
    ],
)
async def test_a_garbage_traceparent_starts_a_new_trace(tracing, exporter, garbage):
    trace = tracing.start_request({"traceparent": garbage}, "chat", "POST", CHAT_PATH)
    sent = trace.upstream_headers({"traceparent": garbage}, A, "POST", A.url + CHAT_PATH)
    trace.end(200, served(A))

    spans = finished(tracing, exporter)
    (server,) = spans[SpanKind.SERVER]
    assert server.parent is None
    trace_id, _, _ = ids(sent["traceparent"])
    assert trace_id == f"{server.context.trace_id:032x}" != TRACE_ID


async def test_sampling_follows_the_caller_then_the_ratio(exporter):
    tracing = Tracing.from_config(TracingConfig(sample_ratio=0.0), exporter)
    unsampled = tracing.start_request({}, "chat", "POST", CHAT_PATH)
    sent = unsampled.upstream_headers({}, A, "POST", A.url + CHAT_PATH)
    unsampled.end(200, served(A))
    caller = tracing.start_request({"traceparent": CALLER}, "chat", "POST", CHAT_PATH)
    caller.upstream_headers({}, A, "POST", A.url + CHAT_PATH)
    caller.end(200, served(A))

    sampled = int(ids(sent["traceparent"])[2], 16) & 1
    assert not sampled, "the engine is told not to record either"
    spans = finished(tracing, exporter)
    assert len(spans[SpanKind.SERVER]) == len(spans[SpanKind.CLIENT]) == 1
    assert f"{spans[SpanKind.SERVER][0].context.trace_id:032x}" == TRACE_ID
    await tracing.shutdown()


async def test_each_tracing_keeps_its_own_spans():
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    t1 = Tracing.from_config(TracingConfig(), first)
    t2 = Tracing.from_config(TracingConfig(), second)
    t1.start_request({}, "chat", "POST", CHAT_PATH).end(200, ForwardResult())
    await t1.shutdown()
    await t2.shutdown()
    assert len(first.get_finished_spans()) == 1
    assert second.get_finished_spans() == ()


async def test_console_exporter_prints_the_spans(capsys):
    tracing = Tracing.from_config(TracingConfig(exporter="console"))
    assert tracing.enabled
    trace = tracing.start_request({"traceparent": CALLER}, "chat", "POST", CHAT_PATH)
    trace.end(200, ForwardResult())
    await tracing.shutdown()
    out = capsys.readouterr().out
    assert f'"trace_id": "0x{TRACE_ID}"' in out
    assert f'"parent_id": "0x{CALLER_SPAN}"' in out


async def test_otlp_exporter_posts_protobuf_to_the_collector(aiohttp_server):
    received: list[ExportTraceServiceRequest] = []
    got = asyncio.Event()

    async def collect(request: web.Request) -> web.Response:
        received.append(ExportTraceServiceRequest.FromString(await request.read()))
        got.set()
        return web.Response(content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    server = await aiohttp_server(app, host="127.0.0.1")
    # A bare collector address gets the OTLP/HTTP traces path appended.
    cfg = TracingConfig(exporter="otlp", endpoint=f"http://127.0.0.1:{server.port}/")
    tracing = Tracing.from_config(cfg)
    trace = tracing.start_request({"traceparent": CALLER}, "chat", "POST", CHAT_PATH)
    trace.set_decision("sim-model", "default", DECISION, 4)
    trace.end(200, ForwardResult())
    await tracing.shutdown()
    await asyncio.wait_for(got.wait(), 10)

    (request,) = received
    (resource_spans,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "prefix-proxy"
    spans = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert [s.name for s in spans] == ["chat sim-model"]
    assert spans[0].trace_id.hex() == TRACE_ID
    assert spans[0].parent_span_id.hex() == CALLER_SPAN


async def test_otlp_to_nobody_does_not_hang_shutdown():
    cfg = TracingConfig(exporter="otlp", endpoint="http://127.0.0.1:9/v1/traces")
    tracing = Tracing.from_config(cfg)
    tracing.start_request({}, "chat", "POST", CHAT_PATH).end(503, ForwardResult())
    await asyncio.wait_for(tracing.shutdown(), 30)
