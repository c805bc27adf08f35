"""The real proxy continues the caller's trace and hands it on to the engine (the simulator
records the ``traceparent`` it received per request in /sim/stats)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import aiohttp
import pytest

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
CHAT = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Trace me through the proxy, please."}],
    "max_tokens": 4,
}


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(n=1, dialect="vllm", model="sim-model", speedup=20.0) as f:
        yield f


@pytest.fixture
def proxy(fleet: SimFleet) -> Iterator[ProxyProcess]:
    cfg = {"telemetry": {"tracing": {"exporter": "console", "service_name": "proxy-e2e"}}}
    with ProxyProcess(fleet.urls, config=cfg) as p:
        yield p


async def chat(proxy: ProxyProcess, request_id: str, headers: dict[str, str]) -> None:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s,
        s.post(
            proxy.url + "/v1/chat/completions",
            json=CHAT,
            headers={"X-Request-ID": request_id, **headers},
        ) as r,
    ):
        assert r.status == 200, await r.text()
        await r.read()


async def received(fleet: SimFleet) -> dict[str, str | None]:
    """traceparent the engine got, by X-Request-ID."""
    (stats,) = await fleet.stats()
    return {rec["x_request_id"]: rec["traceparent"] for rec in stats["records"]}


async def test_the_engine_gets_the_callers_trace_with_the_proxys_span(fleet, proxy):
    await fleet.reset()
    await chat(proxy, "continued", {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"})
    await chat(proxy, "fresh", {})

    got = await received(fleet)
    continued = TRACEPARENT.match(got["continued"] or "")
    assert continued, got
    trace_id, proxy_span, flags = continued.groups()
    assert trace_id == TRACE_ID
    assert proxy_span != CALLER_SPAN, "the engine's parent is the proxy's client span"
    assert int(flags, 16) & 1
    fresh = TRACEPARENT.match(got["fresh"] or "")
    assert fresh, got
    assert fresh.group(1) != TRACE_ID

    # On shutdown the console exporter prints the spans: the server span is the caller's
    # child, and the span the engine was told about is the proxy's own.
    assert proxy.stop() == 0
    log = proxy.log_path.read_text(errors="replace")
    assert f'"parent_id": "0x{CALLER_SPAN}"' in log
    assert f'"span_id": "0x{proxy_span}"' in log
    assert '"service.name": "proxy-e2e"' in log
    assert '"name": "chat sim-model"' in log
