"""Kubernetes discovery against a fake API server on 127.0.0.1 that lists and streams watches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.backends.discovery import KubernetesDiscovery

WAIT_S = 10.0  # bound on every wait; the happy path takes milliseconds
TOKEN = "sa-token-1"
SELECTOR = "kubernetes.io/service-name=vllm"


def endpoint_slice(name: str, version: str, *endpoints: tuple[str, bool | None]) -> dict[str, Any]:
    """An EndpointSlice as the API returns it: two ports, addresses with readiness."""
    items = []
    for address, ready in endpoints:
        conditions = {} if ready is None else {"ready": ready, "serving": ready}
        items.append({"addresses": [address], "conditions": conditions})
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "resourceVersion": version,
            "labels": {"kubernetes.io/service-name": "vllm"},
        },
        "addressType": "IPv4",
        "endpoints": items,
        "ports": [
            {"name": "metrics", "port": 9090, "protocol": "TCP"},
            {"name": "http", "port": 8000, "protocol": "TCP"},
        ],
    }


class FakeApiServer:
    """Serves one namespace's EndpointSlices; watch streams what the test pushes.

    Queue an event dict to stream it, raw bytes to stream them as they are, or None to
    end the stream.
    """

    def __init__(self) -> None:
        self.slices: list[dict[str, Any]] = []
        self.version = "100"
        self.events: asyncio.Queue[dict[str, Any] | bytes | None] = asyncio.Queue()
        self.requests: list[tuple[str, dict[str, str], str | None]] = []
        self.fail_lists = 0
        self.gone_watches = 0
        self.list_body: bytes | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization")
        kind = "watch" if request.query.get("watch") == "1" else "list"
        self.requests.append((kind, dict(request.query), auth))
        if auth != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        if request.query.get("labelSelector") != SELECTOR:
            return web.json_response({"kind": "Status", "code": 400}, status=400)
        if kind == "list":
            if self.fail_lists:
                self.fail_lists -= 1
                return web.json_response({"kind": "Status", "code": 500}, status=500)
            if self.list_body is not None:
                return web.Response(body=self.list_body, content_type="application/json")
            return web.json_response(
                {
                    "kind": "EndpointSliceList",
                    "metadata": {"resourceVersion": self.version},
                    "items": self.slices,
                }
            )
        if self.gone_watches:
            self.gone_watches -= 1
            return web.json_response({"kind": "Status", "code": 410}, status=410)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        while (event := await self.events.get()) is not None:
            await response.write(event if isinstance(event, bytes) else orjson.dumps(event) + b"\n")
        return response

    def push(self, kind: str, obj: object) -> None:
        self.events.put_nowait({"type": kind, "object": obj})

    def count(self, kind: str) -> int:
        return sum(1 for r in self.requests if r[0] == kind and r[2] == f"Bearer {TOKEN}")


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, str]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    fake.events.put_nowait(None)
    await server.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def make(api: tuple[FakeApiServer, str], token_file: Path) -> Callable[..., KubernetesDiscovery]:
    def build(**overrides: Any) -> KubernetesDiscovery:
        options: dict[str, Any] = {
            "namespace": "inference",
            "port_name": "http",
            "api_server": api[1],
            "token_path": token_file,
            "backoff_s": (0.01, 0.05),
        }
        return KubernetesDiscovery("vllm", **(options | overrides))

    return build


@contextlib.asynccontextmanager
async def running(discovery: KubernetesDiscovery) -> AsyncIterator[asyncio.Queue[frozenset[str]]]:
    reports: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    task = asyncio.create_task(discovery.run(reports.put_nowait))
    try:
        yield reports
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def next_report(reports: asyncio.Queue[frozenset[str]]) -> frozenset[str]:
    return await asyncio.wait_for(reports.get(), WAIT_S)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.005)


def urls(*hosts: str) -> frozenset[str]:
    return frozenset(f"http://{h}:8000" for h in hosts)


async def test_list_then_watch_follows_ready_endpoints(
    api: tuple[FakeApiServer, str], make: Callable[..., KubernetesDiscovery]
) -> None:
    fake, _ = api
    fake.slices = [endpoint_slice("vllm-a", "90", ("10.0.0.1", True), ("10.0.0.2", False))]
    async with running(make()) as reports:
        assert await next_report(reports) == urls("10.0.0.1")

        fake.push("ADDED", endpoint_slice("vllm-b", "101", ("10.0.0.3", True), ("10.0.0.4", None)))
        assert await next_report(reports) == urls("10.0.0.1", "10.0.0.3", "10.0.0.4")

        turned = endpoint_slice("vllm-a", "102", ("10.0.0.1", False), ("10.0.0.2", True))
        fake.push("MODIFIED", turned)
        assert await next_report(reports) == urls("10.0.0.2", "10.0.0.3", "10.0.0.4")

        fake.push("BOOKMARK", {"kind": "EndpointSlice", "metadata": {"resourceVersion": "150"}})
        fake.push("DELETED", endpoint_slice("vllm-b", "151"))
        assert await next_report(reports) == urls("10.0.0.2")

        fake.events.put_nowait(None)  # the server ends the watch (its timeoutSeconds)
        await until(lambda: fake.count("watch") == 2)
        fake.push("MODIFIED", endpoint_slice("vllm-a", "160", ("10.0.0.9", True)))
        assert await next_report(reports) == urls("10.0.0.9")

    watches = [q for kind, q, _ in fake.requests if kind == "watch"]
    assert [w["resourceVersion"] for w in watches] == ["100", "151"]
    assert all(
        w["labelSelector"] == SELECTOR and w["allowWatchBookmarks"] == "true" for w in watches
    )
    assert fake.count("list") == 1


async def test_gone_lists_again(
    api: tuple[FakeApiServer, str],
    make: Callable[..., KubernetesDiscovery],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.backends.discovery")
    fake, _ = api
    fake.slices = [endpoint_slice("vllm-a", "90", ("10.0.0.1", True))]
    async with running(make()) as reports:
        assert await next_report(reports) == urls("10.0.0.1")
        await until(lambda: fake.count("watch") == 1)
        fake.slices = [endpoint_slice("vllm-c", "300", ("10.0.0.5", True))]
        fake.version = "300"
        fake.push("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})
        fake.events.put_nowait(None)
        assert await next_report(reports) == urls("10.0.0.5")
        await until(lambda: fake.count("watch") == 2)

        fake.slices = [endpoint_slice("vllm-d", "400", ("10.0.0.6", True))]
        fake.version = "400"
        fake.gone_watches = 1  # the next watch is refused with HTTP 410
        fake.push("BOOKMARK", {"kind": "EndpointSlice", "metadata": {"resourceVersion": "350"}})
        fake.events.put_nowait(None)
        assert await next_report(reports) == urls("10.0.0.6")
        await until(lambda: fake.count("watch") == 4)
    watches = [q for kind, q, _ in fake.requests if kind == "watch"]
    assert [w["resourceVersion"] for w in watches] == ["100", "300", "350", "400"]
    assert fake.count("list") == 3
    # An expired version is routine (etcd compaction), not a failure worth a warning.
    assert "resourceVersion expired" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_rotated_token_is_picked_up_after_401(
    api: tuple[FakeApiServer, str], make: Callable[..., KubernetesDiscovery], token_file: Path
) -> None:
    fake, _ = api
    fake.slices = [endpoint_slice("vllm-a", "90", ("10.0.0.1", True))]
    token_file.write_bytes(b"\xff\xfe garbage")
    async with running(make()) as reports:
        await until(lambda: len(fake.requests) >= 2)
        token_file.write_text("expired-token\nX-Injected: 1")
        await asyncio.sleep(0.1)
        token_file.write_text("expired-token")
        await until(lambda: any(r[2] == "Bearer expired-token" for r in fake.requests))
        assert reports.empty()
        token_file.write_text(TOKEN)
        assert await next_report(reports) == urls("10.0.0.1")
    assert fake.requests[0][2] is None  # an unreadable token is sent as no token
    assert not any("X-Injected" in (r[2] or "") for r in fake.requests)


async def test_server_errors_and_garbage_back_off_then_recover(
    api: tuple[FakeApiServer, str], make: Callable[..., KubernetesDiscovery]
) -> None:
    fake, _ = api
    fake.fail_lists = 2
    fake.list_body = b'{"items": 7, "metadata": {"resourceVersion": "1"'
    junk_slice = {"metadata": {"name": "junk"}, "ports": "http", "endpoints": {"a": 1}}
    fake.slices = [
        endpoint_slice("vllm-a", "90", ("10.0.0.1", True)),
        junk_slice,
        {"metadata": {"name": "no-port"}, "endpoints": [{"addresses": ["10.0.0.8"]}]},
    ]
    async with running(make()) as reports:
        await until(lambda: fake.count("list") >= 3)  # two 500s, then unparseable
        assert reports.empty()
        fake.list_body = None
        assert await next_report(reports) == urls("10.0.0.1")

        fake.push("MODIFIED", "not an object")
        fake.events.put_nowait(b"{not json\n")
        await until(lambda: fake.count("watch") == 2)  # the watch broke: back off, list again
        assert fake.count("list") == 5
        assert reports.empty()  # the same slices again: nothing to report


async def test_port_choice_and_ipv6(
    api: tuple[FakeApiServer, str], make: Callable[..., KubernetesDiscovery]
) -> None:
    fake, _ = api
    fake.slices = [endpoint_slice("vllm-a", "90", ("fd00::1", True))]
    async with running(make(port_name="metrics")) as reports:
        assert await next_report(reports) == {"http://[fd00::1]:9090"}
    async with running(make(port_name=None)) as reports:
        assert await next_report(reports) == {"http://[fd00::1]:9090"}  # the first port
    async with running(make(port_name="grpc")) as reports:
        assert await next_report(reports) == frozenset()


def test_in_cluster_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("inference\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    discovery = KubernetesDiscovery("vllm", namespace_path=tmp_path / "namespace")
    assert discovery.url == (
        "https://10.96.0.1:443/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices"
    )


def test_outside_a_cluster_without_settings_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="namespace"):
        KubernetesDiscovery("vllm", namespace_path=tmp_path / "missing")
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        KubernetesDiscovery("vllm", namespace="inference")
