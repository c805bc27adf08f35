"""The OpenAI surface through the real proxy process, against real simulator processes."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

pytestmark = pytest.mark.asyncio

CHAT = {
    "model": "sim-model",
    "messages": [
        {"role": "system", "content": "You are a careful assistant. " * 20},
        {"role": "user", "content": "Say hello."},
    ],
    "max_tokens": 8,
}


def error_shape(body: dict) -> dict:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


async def test_health_ready_metrics(proxy, client):
    async with client.get(proxy.url + "/health") as r:
        assert r.status == 200
    async with client.get(proxy.url + "/ready") as r:
        assert r.status == 200
        assert (await r.json())["healthy_backends"] == 3
    async with client.get(proxy.url + "/metrics") as r:
        text = await r.text()
        assert "prefix_proxy_backend_healthy" in text


async def test_models_is_the_union_each_once(proxy, client):
    async with client.get(proxy.url + "/v1/models") as r:
        body = await r.json()
    assert r.status == 200
    assert [m["id"] for m in body["data"]] == ["sim-model"]


async def test_non_streaming_passes_through_byte_for_byte(proxy, clean, client):
    body = orjson.dumps(CHAT)
    headers = {"Content-Type": "application/json", "X-Prefix-Proxy-Debug": "1"}
    async with client.post(proxy.url + "/v1/chat/completions", data=body, headers=headers) as r:
        via_proxy = await r.read()
        chosen = orjson.loads(r.headers["X-Prefix-Proxy-Decision"])["backend"]
        assert r.status == 200
        assert r.headers["X-Request-ID"]
        assert "Transfer-Encoding" not in r.headers or r.headers.get("Content-Length") is None
    async with client.post(chosen + "/v1/chat/completions", data=body, headers=headers) as r:
        direct = await r.read()
    a, b = orjson.loads(via_proxy), orjson.loads(direct)
    # The simulator stamps ids and times, and the second call hits its prefix cache;
    # everything else must be identical.
    for doc in (a, b):
        doc.pop("id"), doc.pop("created")
        doc["usage"].pop("prompt_tokens_details")
    assert a == b
    assert a["choices"][0]["message"]["content"]


async def test_streaming_chunks_arrive_before_the_backend_finishes(proxy, clean, client):
    await clean.set_faults(0, chunk_delay_s=0.4)
    await clean.set_faults(1, chunk_delay_s=0.4)
    await clean.set_faults(2, chunk_delay_s=0.4)
    body = dict(CHAT, stream=True, max_tokens=4)
    t0 = time.monotonic()
    async with client.post(proxy.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        first = await r.content.readline()
        t_first = time.monotonic() - t0
        rest = await r.read()
        t_all = time.monotonic() - t0
    assert first.startswith(b"data: ")
    # Chunk 1 reached the client while the backend still held the next ones (0.4 s apart).
    assert t_all - t_first >= 0.8
    assert rest.rstrip().endswith(b"data: [DONE]")


async def test_usage_in_last_chunk_with_include_usage(proxy, clean, client):
    body = dict(CHAT, stream=True, stream_options={"include_usage": True})
    async with client.post(proxy.url + "/v1/chat/completions", json=body) as r:
        lines = [ln for ln in (await r.read()).split(b"\n") if ln.startswith(b"data: {")]
    last = orjson.loads(lines[-1][6:])
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] > 0


async def test_client_disconnect_aborts_upstream_within_a_second(proxy, clean, client):
    body = dict(CHAT, stream=True, max_tokens=20000)  # ~8 s of decoding at this speedup
    r = await client.post(proxy.url + "/v1/chat/completions", json=body)
    await r.content.readline()
    r.close()  # the client leaves mid-stream
    deadline = time.monotonic() + 1.0
    aborts = 0
    while time.monotonic() < deadline:
        aborts = sum(s["totals"]["aborts"] for s in await clean.stats())
        if aborts:
            break
        await asyncio.sleep(0.05)
    assert aborts == 1


async def test_5xx_before_first_byte_is_retried_on_another_backend(proxy, clean, client):
    async with client.post(
        proxy.url + "/v1/chat/completions", json=CHAT, headers={"X-Prefix-Proxy-Debug": "1"}
    ) as r:
        await r.read()
        first = orjson.loads(r.headers["X-Prefix-Proxy-Decision"])["backend"]
    await clean.set_faults(clean.urls.index(first), fail_next=1)  # the prefix's home fails once
    async with client.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
        assert r.status == 200
        assert (await r.json())["choices"]
    async with client.get(proxy.url + "/metrics") as m:
        assert 'prefix_proxy_upstream_retries_total{kind="status_5xx"}' in await m.text()


async def test_hung_backend_times_out_per_try_and_is_retried(proxy, clean, client):
    async with client.post(
        proxy.url + "/v1/chat/completions", json=CHAT, headers={"X-Prefix-Proxy-Debug": "1"}
    ) as r:
        await r.read()
        first = orjson.loads(r.headers["X-Prefix-Proxy-Decision"])["backend"]
    hung = clean.urls.index(first)
    await clean.set_faults(hung, hang=True)
    t0 = time.monotonic()
    async with client.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
        assert r.status == 200
    assert time.monotonic() - t0 >= 2.0  # it waited out the 2 s per-try timeout first


async def test_all_backends_hanging_gives_504(proxy, clean, client):
    for i in range(3):
        await clean.set_faults(i, hang=True)
    body = dict(CHAT, messages=[{"role": "user", "content": "unique 504 probe"}])
    async with client.post(proxy.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 504
        assert error_shape(await r.json())["code"] == "upstream_timeout"


async def test_midstream_failure_ends_stream_with_error_event(proxy, clean, client):
    for i in range(3):
        await clean.set_faults(i, die_after_chunks=2)
    body = dict(CHAT, stream=True, max_tokens=20)
    async with client.post(proxy.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        data = await asyncio.wait_for(r.read(), 10)
    events = [ln for ln in data.split(b"\n") if ln.startswith(b"data: ")]
    assert len(events) >= 2
    err = orjson.loads(events[-1][6:])
    assert err["error"]["code"] == "upstream_midstream"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_body"),
        (b'{"messages": []}', 400, "invalid_model"),
        (b'{"model": "sim-model", "messages": "hi"}', 400, "invalid_type"),
        (b'{"model": "sim-model"}', 400, "missing_field"),
        (b'{"model": "sim-model", "messages": [], "stream": "yes"}', 400, "invalid_type"),
        (
            b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model_not_found",
        ),
        (
            b'{"model": "sim-model", "messages": [{"role": "user", "content": "'
            + b"x" * 1_100_000
            + b'"}]}',
            413,
            "body_too_large",
        ),
    ],
)
async def test_proxy_errors_have_the_openai_shape(proxy, client, body, status, code):
    async with client.post(
        proxy.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == status
        assert error_shape(await r.json())["code"] == code


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        (
            "/v1/completions",
            {"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 4},
            "choices",
        ),
        ("/v1/embeddings", {"model": "sim-model", "input": "embed me"}, "data"),
        (
            "/v1/responses",
            {"model": "sim-model", "input": "hello", "instructions": "be brief"},
            None,
        ),
        (
            "/v1/messages",
            {
                "model": "sim-model",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
            },
            None,
        ),
    ],
)
async def test_other_endpoints_route_and_pass_through(proxy, client, path, body, key):
    async with client.post(proxy.url + path, json=body) as r:
        assert r.status == 200, await r.text()
        doc = await r.json()
    if key:
        assert doc[key]


async def test_no_healthy_backend_gives_503(fleet, client):
    from loadtests.proxy_process import ProxyProcess

    with ProxyProcess(["http://127.0.0.1:9"], config={"health": {"interval_s": 0.2}}) as p:
        async with client.post(p.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 503
            assert error_shape(await r.json())["code"] == "no_healthy_backend"
        async with client.get(p.url + "/ready") as r:
            assert r.status == 503


async def test_unknown_v1_paths_pass_through_to_a_backend(proxy, client):
    async with client.get(proxy.url + "/v1/no/such/route") as r:
        body = await r.read()
        assert r.status == 404
        assert r.headers["X-Request-ID"]
    assert b"model_not_found" not in body  # the backend's own 404, not the proxy's
