"""Recent-window arithmetic: rates from counter deltas and quantiles from bucket deltas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.ui.window import (
    Sample,
    SampleHistory,
    bucket_delta,
    delta,
    histogram_quantile,
    rate,
)

INF = math.inf


def test_quantile_interpolates_inside_the_bucket_holding_the_rank() -> None:
    buckets = ((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0))
    # rank 20 of 40 lies halfway through (0.1, 0.5]: 10 before it, 20 inside.
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    # rank 39.6 lies in (0.5, 1.0]: 30 before it, 10 inside.
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * 0.96)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    buckets = ((0.1, 1.0), (0.5, 1.0), (INF, 10.0))
    assert histogram_quantile(0.99, buckets) == 0.5


def test_quantile_without_data_is_none() -> None:
    assert histogram_quantile(0.5, ()) is None
    assert histogram_quantile(0.5, ((0.1, 0.0), (INF, 0.0))) is None
    assert histogram_quantile(0.0, ((0.1, 1.0), (INF, 1.0))) is None
    assert histogram_quantile(1.5, ((0.1, 1.0), (INF, 1.0))) is None


@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=8),
    st.floats(0.01, 1.0),
)
def test_quantile_stays_within_the_finite_bounds(counts: list[int], q: float) -> None:
    bounds = [0.01 * 2**i for i in range(len(counts))]
    cumulative, running = [], 0
    for le, c in zip([*bounds[:-1], INF], counts, strict=True):
        running += c
        cumulative.append((le, float(running)))
    got = histogram_quantile(q, cumulative)
    if running == 0:
        assert got is None
    else:
        assert got is not None
        assert 0.0 <= got <= max(bounds[:-1], default=0.0)


def test_bucket_delta_counts_only_new_observations() -> None:
    then = ((0.1, 5.0), (0.5, 8.0), (INF, 9.0))
    now = ((0.1, 6.0), (0.5, 12.0), (INF, 15.0))
    assert bucket_delta(now, then) == ((0.1, 1.0), (0.5, 4.0), (INF, 6.0))
    assert bucket_delta(now, ()) == now


def test_a_counter_that_went_down_was_reset() -> None:
    assert delta(12.0, 10.0) == 2.0
    assert delta(3.0, 10.0) == 3.0
    assert rate(30.0, 10.0, 4.0) == 5.0


def test_history_baseline_is_the_oldest_reading_inside_the_window() -> None:
    h = SampleHistory(keep_s=60.0, min_gap_s=0.5)
    for t in (0.0, 5.0, 10.0, 15.0):
        h.add(Sample(at=t, requests=t))
    assert h.baseline(16.0, 10.0) == Sample(at=10.0, requests=10.0)
    assert h.baseline(16.0, 60.0) == Sample(at=0.0, requests=0.0)
    assert h.baseline(100.0, 10.0) is None
    # A reading taken at "now" is no baseline for now: no zero-length window.
    assert h.baseline(0.0, 10.0) is None


def test_history_keeps_one_reading_per_gap_and_drops_old_ones() -> None:
    h = SampleHistory(keep_s=10.0, min_gap_s=1.0)
    for i in range(100):
        h.add(Sample(at=i * 0.25, requests=float(i)))
    # Readings every 0.25 s up to 24.75 s: one per second is kept, the last 10 s of them.
    assert len(h) == 11
    assert h.baseline(24.75, 100.0) == Sample(at=14.0, requests=56.0)
