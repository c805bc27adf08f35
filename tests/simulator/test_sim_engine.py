"""Batching, queueing, client aborts, fault knobs and bad input, over real sockets."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtests.fleet import SimFleet
from tests.simulator.conftest import get, parse_sse, post, post_json, sim_stats

LONG = {"messages": [{"role": "user", "content": "write a long essay"}], "max_tokens": 2000}
POLL_S = 0.05
POLL_LIMIT = 100  # 5 s


@pytest.fixture(scope="module")
def slow() -> Iterator[SimFleet]:
    """Real-time decoding (8 ms a token) and one running sequence at a time."""
    with SimFleet(n=2, dialect=["vllm", "llamacpp"], max_running=1) as fleet:
        yield fleet


@pytest.fixture
def slow_urls(slow: SimFleet) -> list[str]:
    for url in slow.urls:
        post(url + "/sim/reset", {})
    return slow.urls


async def wait_for(predicate: Callable[[], bool]) -> None:
    """Poll a condition a bounded number of times; fail if it never holds."""
    for _ in range(POLL_LIMIT):
        if predicate():
            return
        await asyncio.sleep(POLL_S)
    raise AssertionError("condition not reached")


def gauge(url: str, name: str, **labels: str) -> float:
    """The value of the first sample called ``name`` whose labels include ``labels``."""
    for family in text_string_to_metric_families(get(url + "/metrics")[1]):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    raise KeyError(name)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_client_disconnect_mid_stream_aborts_the_sequence(
    slow_urls: list[str], http: aiohttp.ClientSession
) -> None:
    url = slow_urls[0]
    resp = await http.post(url + "/v1/chat/completions", json={**LONG, "stream": True})
    assert resp.status == 200
    await resp.content.readuntil(b"\n\n")
    await resp.content.readuntil(b"\n\n")
    resp.close()
    await wait_for(lambda: sim_stats(url)["totals"]["aborts"] == 1)
    stats = sim_stats(url)
    assert stats["running"] == 0
    assert stats["records"][0]["finish_reason"] == "abort"
    assert 0 < stats["records"][0]["completion_tokens"] < 2000
    assert gauge(url, "vllm:request_success_total", finished_reason="abort") == 1


async def test_client_timeout_on_nonstream_request_aborts_it(
    slow_urls: list[str], http: aiohttp.ClientSession
) -> None:
    url = slow_urls[1]
    with pytest.raises(TimeoutError):
        await http.post(
            url + "/v1/chat/completions", json=LONG, timeout=aiohttp.ClientTimeout(total=0.3)
        )
    await wait_for(lambda: sim_stats(url)["totals"]["aborts"] == 1)
    assert sim_stats(url)["running"] == 0


async def test_beyond_max_running_requests_wait_in_fifo_order(
    slow_urls: list[str], http: aiohttp.ClientSession
) -> None:
    vllm, llamacpp = slow_urls
    body = {**LONG, "stream": True, "max_tokens": 30}
    streams = [await http.post(vllm + "/v1/chat/completions", json=body) for _ in range(3)]
    held = await http.post(llamacpp + "/v1/chat/completions", json={**LONG, "stream": True})
    extra = await http.post(llamacpp + "/v1/chat/completions", json={**LONG, "stream": True})
    await wait_for(
        lambda: (
            gauge(vllm, "vllm:num_requests_running") == 1
            and gauge(vllm, "vllm:num_requests_waiting") == 2
        )
    )
    await wait_for(lambda: gauge(llamacpp, "llamacpp:requests_deferred") == 1)
    assert gauge(llamacpp, "llamacpp:requests_processing") == 1
    slots = json.loads(get(llamacpp + "/slots")[1])
    assert [s["is_processing"] for s in slots] == [True]
    texts = [await s.text() for s in streams]
    for s in (held, extra):
        s.close()
    assert all(t.endswith("data: [DONE]\n\n") for t in texts)
    records = sim_stats(vllm)["records"]
    by_admission = sorted(records, key=lambda r: r["seq"])
    arrivals = [r["arrival_unix"] for r in by_admission]
    assert arrivals == sorted(arrivals), "admitted in arrival order"
    await wait_for(lambda: sim_stats(llamacpp)["totals"]["aborts"] == 2)


def test_prefill_time_follows_uncached_tokens() -> None:
    """Lower bound only: a 1000-token uncached prompt at 500 ms per 1k takes >= 0.5 s."""
    with SimFleet(n=1, prefill_ms_per_1k_tokens=500, decode_ms_per_token=0) as fleet:
        body = {"prompt": "p" * 4000, "max_tokens": 1}
        begin = time.monotonic()
        status, first = post_json(fleet.urls[0] + "/v1/completions", body)
        assert status == 200 and time.monotonic() - begin >= 0.5
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        _, second = post_json(fleet.urls[0] + "/v1/completions", body)
        record = sim_stats(fleet.urls[0])["records"]
        assert record[0]["ttft_s"] >= 0.5
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 992


def configure(url: str, **knobs: Any) -> dict[str, Any]:
    status, body = post_json(url + "/sim/config", knobs)
    assert status == 200, body
    return body


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_fail_next_fails_exactly_k_requests(urls: dict[str, str]) -> None:
    url = urls["vllm"]
    configure(url, fail_next=2, fail_status=503)
    codes = [post(url + "/v1/chat/completions", CHAT)[0] for _ in range(3)]
    assert codes == [503, 503, 200]
    assert sim_stats(url)["totals"]["errors"] == 2


async def test_hang_accepts_and_never_answers(
    urls: dict[str, str], http: aiohttp.ClientSession
) -> None:
    url = urls["sglang"]
    configure(url, hang=True)
    with pytest.raises(TimeoutError):
        await http.post(
            url + "/v1/chat/completions", json=CHAT, timeout=aiohttp.ClientTimeout(total=0.3)
        )
    assert get(url + "/health")[0] == 200, "only generation hangs"


def test_slow_stream_delays_every_chunk(urls: dict[str, str]) -> None:
    url = urls["vllm"]
    configure(url, chunk_delay_s=0.05)
    begin = time.monotonic()
    status, text = post(url + "/v1/chat/completions", {**CHAT, "stream": True})
    events = parse_sse(text)
    assert status == 200 and events[-1] == (None, "[DONE]")
    assert time.monotonic() - begin >= 0.05 * len(events)


async def test_die_mid_stream_closes_after_k_chunks(
    urls: dict[str, str], http: aiohttp.ClientSession
) -> None:
    url = urls["llamacpp"]
    configure(url, die_after_chunks=2)
    received = b""
    async with http.post(url + "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for data in resp.content.iter_any():
                received += data
    assert received.count(b"data: ") == 2
    totals = sim_stats(url)["totals"]
    assert totals["errors"] == 1 and totals["aborts"] == 0
    with pytest.raises(aiohttp.ClientError):
        await http.post(url + "/v1/chat/completions", json=CHAT)


def test_metrics_faults(urls: dict[str, str]) -> None:
    url = urls["vllm"]
    configure(url, metrics_garbage=True)
    status, text = get(url + "/metrics")
    assert status == 200
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))
    configure(url, metrics_garbage=False, metrics_delay_s=0.2)
    begin = time.monotonic()
    assert get(url + "/metrics")[0] == 200
    assert time.monotonic() - begin >= 0.2


def test_health_fault_and_reset_restores_knobs(urls: dict[str, str]) -> None:
    for url in urls.values():
        configure(url, health_status=503)
        assert get(url + "/health")[0] == 503
        post(url + "/sim/reset", {})
        assert get(url + "/health")[0] == 200


@pytest.mark.parametrize(
    "knobs",
    [{"no_such_knob": 1}, {"fail_next": -1}, {"hang": "yes"}, {"chunk_delay_s": "slow"}],
)
def test_bad_fault_config_is_rejected_without_change(urls: dict[str, str], knobs: Any) -> None:
    url = urls["vllm"]
    before = json.loads(get(url + "/sim/config")[1])
    status, body = post_json(url + "/sim/config", knobs)
    assert status == 400 and "error" in body
    assert json.loads(get(url + "/sim/config")[1]) == before


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"messages": "nope"}, 400),
        ({"messages": []}, 400),
        ({"messages": [{"content": "no role"}]}, 400),
        ({"messages": [{"role": "user", "content": 5}]}, 400),
        ({**CHAT, "max_tokens": 0}, 400),
        ({**CHAT, "max_tokens": "many"}, 400),
        ({**CHAT, "stream": "yes"}, 400),
        ({**CHAT, "model": "other-model"}, 404),
        ({"messages": [{"role": "user", "content": "x" * 200_000}]}, 400),
        ([1, 2, 3], 400),
    ],
)
def test_bad_requests_get_clear_errors(urls: dict[str, str], body: Any, status: int) -> None:
    url = urls["vllm"]
    got, answer = post_json(url + "/v1/chat/completions", body)
    assert got == status
    assert answer["error"]["message"]
    assert post(url + "/v1/chat/completions", CHAT)[0] == 200, "still serving"
    assert sim_stats(url)["totals"]["rejected"] == 1


def test_invalid_json_body(urls: dict[str, str]) -> None:
    request = urllib.request.Request(
        urls["llamacpp"] + "/v1/completions", data=b"{not json", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=5)
    assert e.value.code == 400
    assert "invalid JSON" in json.loads(e.value.read())["error"]["message"]
