"""The Kubernetes config finds its engines: the proxy, run with the base ConfigMap's config,
watches a fake API server whose EndpointSlice is what Kubernetes derives from the example
engine Service, and its readiness probe turns from failing to passing once the replica it
finds (a simulator) is healthy."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess
from tests.deploy.support import BASE, EXAMPLES, config_map_config, load_docs, resolve
from tests.integration.test_discovery_kubernetes import TOKEN, FakeApiServer

NAMESPACE = "llm"
WAIT_S = 20.0


def engine_slice(service: dict[str, Any], url: str) -> dict[str, Any]:
    """The EndpointSlice the control plane writes for ``service`` with one ready pod at
    ``url``: its ports carry the Service's port names."""
    host, port = url.removeprefix("http://").split(":")
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": f"{service['metadata']['name']}-abcde",
            "resourceVersion": "101",
            "labels": {"kubernetes.io/service-name": service["metadata"]["name"]},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [
            {"name": p["name"], "port": int(port), "protocol": p["protocol"]}
            for p in service["spec"]["ports"]
        ],
    }


async def test_readiness_follows_the_engines_discovery_finds(tmp_path: Path) -> None:
    config = yaml.safe_load(config_map_config(BASE, tmp_path / "configmap").read_text())
    service_name = config["backends"]["kubernetes"]["service"]
    (service,) = [
        o
        for p in EXAMPLES
        for o in load_docs(p)
        if o["kind"] == "Service" and o["metadata"]["name"] == service_name
    ]
    probe = resolve(BASE).objects[("Deployment", "prefix-proxy")]["spec"]["template"]["spec"]
    ready_path = probe["containers"][0]["readinessProbe"]["httpGet"]["path"]

    fake = FakeApiServer()
    app = web.Application()
    route = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
    app.router.add_get(route, fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    # Where the pod would read them: the API server, its namespace, its token.
    config["backends"]["kubernetes"] |= {
        "api_server": str(server.make_url("")).rstrip("/"),
        "namespace": NAMESPACE,
        "token_path": str(token),
    }
    config.pop("cluster")  # no Redis here: cluster sync has its own tests
    config.pop("listen")  # ProxyProcess listens on a free loopback port
    config["policy"] = str(tmp_path / "configmap" / config["policy"])
    try:
        async with (
            SimFleet(n=1, speedup=20.0) as fleet,
            ProxyProcess([], config=config) as proxy,
            aiohttp.ClientSession() as session,
        ):
            assert await status(session, proxy.url + ready_path) == 503  # nothing found yet
            fake.push("ADDED", engine_slice(service, fleet.urls[0]))
            deadline = time.monotonic() + WAIT_S
            while await status(session, proxy.url + ready_path) != 200:
                assert time.monotonic() < deadline, "the discovered engine never made it ready"
                await asyncio.sleep(0.1)
    finally:
        fake.events.put_nowait(None)
        await server.close()


async def status(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as resp:
        return resp.status
