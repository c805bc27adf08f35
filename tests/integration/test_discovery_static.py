"""Static discovery, several sources merged, and discovery built from the config."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from proxy.backends.discovery import (
    Discovery,
    DnsDiscovery,
    KubernetesDiscovery,
    MergedDiscovery,
    StaticDiscovery,
    from_config,
)
from proxy.config import BackendsConfig, DnsDiscoveryConfig, KubernetesDiscoveryConfig

WAIT_S = 10.0


@contextlib.asynccontextmanager
async def running(discovery: Discovery) -> AsyncIterator[asyncio.Queue[frozenset[str]]]:
    reports: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    task = asyncio.create_task(discovery.run(reports.put_nowait))
    try:
        yield reports
        assert not task.done(), "a discovery runs until cancelled"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_static_reports_its_list_once() -> None:
    source = StaticDiscovery(
        ["http://10.0.0.1:8000/", "http://10.0.0.2:8000", "http://10.0.0.1:8000"]
    )
    async with running(source) as reports:
        assert await asyncio.wait_for(reports.get(), WAIT_S) == {
            "http://10.0.0.1:8000",
            "http://10.0.0.2:8000",
        }
        await asyncio.sleep(0.05)
        assert reports.empty()


async def test_merged_sources_report_the_union() -> None:
    merged = MergedDiscovery(
        [
            StaticDiscovery(["http://10.0.0.1:8000"]),
            DnsDiscovery("localhost", 8123, interval_s=0.05),
        ]
    )
    async with running(merged) as reports:
        async with asyncio.timeout(WAIT_S):
            while "http://127.0.0.1:8123" not in (latest := await reports.get()):
                pass
    assert "http://10.0.0.1:8000" in latest


def test_from_config_builds_what_the_section_names() -> None:
    assert from_config(BackendsConfig()) is None
    static = from_config(BackendsConfig(static=["http://a:1"]))
    assert isinstance(static, StaticDiscovery)
    assert static.urls == {"http://a:1"}

    dns_only = from_config(
        BackendsConfig(
            dns=DnsDiscoveryConfig(name="_llm._tcp.x.", srv=True, nameserver="10.0.0.10")
        )
    )
    assert isinstance(dns_only, DnsDiscovery)
    assert (dns_only.srv, dns_only.nameservers) == (True, [("10.0.0.10", 53)])

    both = from_config(
        BackendsConfig(
            static=["http://a:1"],
            kubernetes=KubernetesDiscoveryConfig(
                service="vllm", namespace="inference", api_server="https://k8s:6443"
            ),
        )
    )
    assert isinstance(both, MergedDiscovery)
    assert [type(s) for s in both.sources] == [StaticDiscovery, KubernetesDiscovery]
