"""After real traffic the proxy's /metrics and access log say what happened."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess

pytestmark = pytest.mark.asyncio


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(metrics: dict, name: str, **labels: str) -> float:
    return sum(
        v
        for (n, lbl), v in metrics.items()
        if n == name and all(dict(lbl).get(k) == want for k, want in labels.items())
    )


async def test_counters_histograms_and_gauges_move_with_traffic():
    async with SimFleet(n=2, speedup=20.0) as fleet:
        with ProxyProcess(
            fleet.urls, config={"telemetry": {"access_log": True}}, log_level="INFO"
        ) as p:
            async with aiohttp.ClientSession() as s:
                async with s.get(p.url + "/metrics") as r:
                    before = samples(await r.text())
                history = [{"role": "system", "content": "You are terse. " * 100}]
                for turn in range(6):  # one conversation: later turns should match earlier blocks
                    history.append({"role": "user", "content": f"question {turn}"})
                    body = {"model": "sim-model", "messages": history, "max_tokens": 3}
                    async with s.post(p.url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
                        reply = await r.json()
                    history.append(reply["choices"][0]["message"])
                async with s.post(p.url + "/v1/chat/completions", data=b"{bad") as r:
                    assert r.status == 400
                for _ in range(30):  # the engines' own counters arrive with the next scrape
                    async with s.get(p.url + "/metrics") as r:
                        after = samples(await r.text())
                    if total(after, "prefix_proxy_backend_engine_prefix_hit_ratio") > 0:
                        break
                    await asyncio.sleep(0.1)
            log_text = p.logs()

    ok = total(
        after, "prefix_proxy_requests_total", endpoint="chat", model="sim-model", status="200"
    )
    assert ok - total(before, "prefix_proxy_requests_total", status="200") == 6
    assert total(after, "prefix_proxy_rejected_requests_total", reason="invalid_json") == 1
    assert total(after, "prefix_proxy_ttft_seconds_count", endpoint="chat") == 6
    assert total(after, "prefix_proxy_request_duration_seconds_count", endpoint="chat") == 7
    assert total(after, "prefix_proxy_predicted_prefix_match_ratio_count") == 6
    # Turns 2..6 resend turn 1's prefix: at least one decision was won by the prefix scorer.
    assert total(after, "prefix_proxy_routing_decisions_total", reason="prefix") >= 1
    assert total(after, "prefix_proxy_predicted_prefix_match_ratio_sum") > 2.0
    predicted = [
        v for (n, _), v in after.items() if n == "prefix_proxy_backend_predicted_prefix_hit_ratio"
    ]
    assert predicted and max(predicted) > 0.5
    engine = [
        v for (n, _), v in after.items() if n == "prefix_proxy_backend_engine_prefix_hit_ratio"
    ]
    assert engine and max(engine) > 0.5  # the simulator really hit its cache
    assert total(after, "prefix_proxy_backend_healthy") == 2
    assert total(after, "prefix_proxy_backend_index_blocks") > 0

    lines = [ln for ln in log_text.splitlines() if "prefix_proxy.access" in ln]
    entries = [orjson.loads(ln.split("prefix_proxy.access ", 1)[1]) for ln in lines]
    chats = [e for e in entries if e["status"] == 200]
    assert len(chats) == 6
    for e in chats:
        assert e["request_id"] and e["backend"] in fleet.urls and e["model"] == "sim-model"
        assert e["ttft_s"] is not None and e["duration_s"] >= e["ttft_s"]
        assert e["prompt_blocks"] > 0
    assert max(e["matched_blocks"] for e in chats) > 0
    assert any(e["status"] == 400 for e in entries)
