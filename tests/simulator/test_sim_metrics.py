"""/metrics, /slots and /props use the engines' real names, types and label sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from loadtests.simulator.prompt import DEFAULT_TEMPLATE_PATH
from tests.simulator.conftest import (
    LLAMACPP_FIXTURES,
    VLLM_FIXTURES,
    fixture_text,
    get,
    post_json,
)

REQUEST = {
    "messages": [
        {"role": "system", "content": "You are terse. " * 20},
        {"role": "user", "content": "go"},
    ],
    "max_tokens": 3,
}


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def scrape(url: str) -> dict[str, Metric]:
    status, text = get(url + "/metrics")
    assert status == 200
    return families(text)


def value(metric: Metric, **labels: str) -> float:
    matches = [s.value for s in metric.samples if labels.items() <= s.labels.items()]
    assert matches, f"no sample of {metric.name} with {labels}"
    return matches[0]


def warm_up(url: str) -> tuple[int, int]:
    """Send the same request twice; return (prompt tokens, cached tokens) in total."""
    prompt = cached = 0
    for _ in range(2):
        status, body = post_json(url + "/v1/chat/completions", REQUEST)
        assert status == 200
        prompt += body["usage"]["prompt_tokens"]
        cached += body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    return prompt, cached


def label_names(metric: Metric) -> set[frozenset[str]]:
    return {frozenset(s.labels) - {"le"} for s in metric.samples}


def test_vllm_metrics_use_real_names_types_and_labels(urls: dict[str, str]) -> None:
    real = families(fixture_text(VLLM_FIXTURES / "metrics.txt"))
    prompt, cached = warm_up(urls["vllm"])
    ours = scrape(urls["vllm"])
    assert set(ours) <= set(real), "no invented vllm: names"
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
        "vllm:time_to_first_token_seconds",
    ):
        assert ours[name].type == real[name].type, name
    for name, metric in ours.items():
        if name == "vllm:cache_config_info":
            continue
        assert label_names(metric) == label_names(real[name]), name
    info = ours["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16" and info["num_gpu_blocks"] == str(65536 // 16)
    assert set(info) <= set(real["vllm:cache_config_info"].samples[0].labels)
    assert value(ours["vllm:prefix_cache_queries"]) == prompt
    assert value(ours["vllm:prefix_cache_hits"]) == cached
    assert value(ours["vllm:time_to_first_token_seconds"], le="+Inf") == 2
    assert value(ours["vllm:request_success"], finished_reason="length") == 2
    assert value(ours["vllm:num_requests_running"], engine="0", model_name="sim-model") == 0


def test_sglang_metrics_use_real_names(urls: dict[str, str]) -> None:
    prompt, cached = warm_up(urls["sglang"])
    ours = scrape(urls["sglang"])
    for name, kind in (
        ("sglang:num_running_reqs", "gauge"),
        ("sglang:num_queue_reqs", "gauge"),
        ("sglang:token_usage", "gauge"),
        ("sglang:max_total_num_tokens", "gauge"),
        ("sglang:cache_hit_rate", "gauge"),
        ("sglang:prompt_tokens", "counter"),
        ("sglang:generation_tokens", "counter"),
        ("sglang:time_to_first_token_seconds", "histogram"),
    ):
        assert ours[name].type == kind, name
        assert label_names(ours[name]) == {frozenset({"model_name"})}, name
    assert value(ours["sglang:cache_hit_rate"]) == pytest.approx(cached / prompt)
    assert value(ours["sglang:max_total_num_tokens"]) == 65536
    assert value(ours["sglang:prompt_tokens"]) == prompt


def test_llamacpp_metrics_match_the_real_name_set(urls: dict[str, str]) -> None:
    real = families(fixture_text(LLAMACPP_FIXTURES / "metrics.txt"))
    prompt, cached = warm_up(urls["llamacpp"])
    status, text = get(urls["llamacpp"] + "/metrics")
    assert status == 200
    ours = families(text)
    assert {n: f.type for n, f in ours.items()} == {n: f.type for n, f in real.items()}
    assert all(label_names(f) == {frozenset()} for f in ours.values())
    assert "{" not in text, "llama.cpp metrics carry no labels"
    assert value(ours["llamacpp:prompt_tokens"]) == prompt - cached
    assert value(ours["llamacpp:prompt_tokens_cached"]) == cached
    assert value(ours["llamacpp:requests_processing"]) == 0


def test_llamacpp_props_and_slots(urls: dict[str, str]) -> None:
    real_props = json.loads(fixture_text(LLAMACPP_FIXTURES / "props.json"))
    real_slots = json.loads(fixture_text(LLAMACPP_FIXTURES / "slots.json"))
    warm_up(urls["llamacpp"])
    props = json.loads(get(urls["llamacpp"] + "/props")[1])
    slots = json.loads(get(urls["llamacpp"] + "/slots")[1])
    assert set(props) <= set(real_props)
    assert props["chat_template"] == Path(DEFAULT_TEMPLATE_PATH).read_text()
    assert props["total_slots"] == 16 == len(slots)
    assert props["default_generation_settings"]["n_ctx"] == 65536 // 16
    assert set(slots[0]) == set(real_slots[0])
    assert [s["id"] for s in slots] == list(range(16))
    assert not any(s["is_processing"] for s in slots)
    assert slots[0]["n_prompt_tokens_cache"] > 0, "slot 0 served the cached second request"


def test_engine_specific_endpoints_exist_only_in_their_dialect(urls: dict[str, str]) -> None:
    assert get(urls["vllm"] + "/slots")[0] == 404
    assert get(urls["sglang"] + "/props")[0] == 404
    info = json.loads(get(urls["sglang"] + "/server_info")[1])
    assert info["max_total_num_tokens"] == 65536
    assert json.loads(get(urls["sglang"] + "/model_info")[1])["model_path"] == "sim-model"
