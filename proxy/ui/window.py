"""Recent-window statistics from cumulative counters: rates and histogram quantiles.

Prometheus counters only grow, so "what happened lately" is the difference between the
reading now and a reading taken a little while ago. Readings are taken when the status page
polls (no background task, nothing to pay while nobody is watching); the first poll after a
quiet spell has no baseline and reports no rate rather than a made-up one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

Buckets = tuple[tuple[float, float], ...]
"""A cumulative histogram: (upper bound, observations <= bound), ascending, ending at +Inf."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of the counters the page shows, at a monotonic time."""

    at: float
    requests: float
    backend_requests: Mapping[str, float] = field(default_factory=dict)
    decisions: Mapping[str, float] = field(default_factory=dict)
    ttft: Buckets = ()


class SampleHistory:
    """Readings from the last ``keep_s`` seconds, at most one per ``min_gap_s``."""

    def __init__(self, keep_s: float = 60.0, min_gap_s: float = 0.5) -> None:
        self.keep_s = keep_s
        self.min_gap_s = min_gap_s
        self._samples: deque[Sample] = deque()

    def __len__(self) -> int:
        return len(self._samples)

    def baseline(self, now: float, window_s: float) -> Sample | None:
        """The oldest reading taken within ``window_s`` before ``now`` (and before it)."""
        for s in self._samples:
            if now - window_s <= s.at < now:
                return s
        return None

    def add(self, sample: Sample) -> None:
        if self._samples and sample.at - self._samples[-1].at < self.min_gap_s:
            return
        self._samples.append(sample)
        while self._samples and sample.at - self._samples[0].at > self.keep_s:
            self._samples.popleft()


def delta(now: float, then: float) -> float:
    """Growth of a counter; a counter that went down was reset, and counts from zero."""
    return now if now < then else now - then


def rate(now: float, then: float, elapsed_s: float) -> float:
    return delta(now, then) / elapsed_s


def bucket_delta(now: Buckets, then: Buckets) -> Buckets:
    """Observations per bound made between two readings of the same histogram."""
    before = dict(then)
    return tuple((le, max(0.0, count - before.get(le, 0.0))) for le, count in now)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' estimate: linear inside the bucket holding the rank; None with no data.

    A rank in the +Inf bucket answers with the highest finite bound, as Prometheus does.
    """
    if not buckets or not 0.0 < q <= 1.0:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            share = (rank - lower_count) / (count - lower_count)
            return lower_le + (le - lower_le) * share
        lower_le, lower_count = le, count
    return lower_le
