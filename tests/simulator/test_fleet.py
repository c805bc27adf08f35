"""SimFleet starts real simulator processes on free ports and always stops them."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from loadtests.fleet import SimFleet, free_port, sim_flags, wait_http_ok, wait_http_ok_sync


@contextlib.asynccontextmanager
async def http_post(url: str, body: Any) -> AsyncIterator[aiohttp.ClientResponse]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        yield resp


async def test_mixed_fleet_starts_and_stops() -> None:
    async with SimFleet(n=3, dialect=["vllm", "sglang", "llamacpp"], model="m1") as fleet:
        procs = [r.proc for r in fleet.replicas]
        assert len(set(fleet.urls)) == 3
        async with aiohttp.ClientSession() as http:
            for url, dialect in zip(fleet.urls, ["vllm", "sglang", "llamacpp"], strict=True):
                async with http.get(url + "/metrics") as resp:
                    assert f"{dialect}:" in await resp.text()
                async with http.get(url + "/v1/models") as resp:
                    assert (await resp.json())["data"][0]["id"] == "m1"
        stats = await fleet.stats()
        assert [s["dialect"] for s in stats] == ["vllm", "sglang", "llamacpp"]
        assert (await fleet.set_faults(1, fail_next=1))["fail_next"] == 1
        async with http_post(fleet.urls[1] + "/v1/completions", {"prompt": "x"}) as resp:
            assert resp.status == 500
        await fleet.reset()
        with pytest.raises(ValueError, match="unknown fault knob"):
            await fleet.set_faults(0, bogus=True)
    assert all(p.poll() is not None for p in procs)


def test_sync_fleet_passes_flags_and_stops_on_error() -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        SimFleet(n=2, max_running=3, dialect="llamacpp") as fleet,
    ):
        procs = [r.proc for r in fleet.replicas]
        with urllib.request.urlopen(fleet.urls[1] + "/props", timeout=5) as resp:
            assert json.loads(resp.read())["total_slots"] == 3
        raise RuntimeError("boom")
    assert all(p.poll() is not None for p in procs)


def test_bad_simulator_flags_fail_with_the_log() -> None:
    with pytest.raises(RuntimeError, match="invalid choice"):
        SimFleet(n=1, dialect="tgi", startup_timeout_s=5).__enter__()


def test_mismatched_dialect_list_is_rejected() -> None:
    with pytest.raises(ValueError, match="2 entries for 3 replicas"):
        SimFleet(n=3, dialect=["vllm", "sglang"])


def test_sim_flags() -> None:
    assert sim_flags({"capacity_tokens": 64, "hang": True, "metrics_garbage": False}) == [
        "--capacity-tokens",
        "64",
        "--hang",
    ]


async def test_wait_http_ok_times_out_on_a_closed_port() -> None:
    url = f"http://127.0.0.1:{free_port()}/health"
    with pytest.raises(TimeoutError):
        await wait_http_ok(url, 0.2)
    with pytest.raises(TimeoutError):
        wait_http_ok_sync(url, 0.2)
    with pytest.raises(RuntimeError, match="exited"):
        await wait_http_ok(url, 5, alive=lambda: False)
