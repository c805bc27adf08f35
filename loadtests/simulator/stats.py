"""What the replica did: totals, per-request records (for /sim/stats) and metric counters."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

# Bucket bounds of the real engines' histograms (vLLM 0.32 and SGLang use the same ones).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class Histogram:
    """Cumulative-on-export Prometheus histogram."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, ending with +Inf."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass(slots=True)
class Totals:
    """Counters since start or the last reset.

    requests: generation requests that reached the engine; prompt_tokens / cached_tokens are
    summed when a request is scheduled; errors are injected failures; rejected are invalid
    requests answered 4xx; aborts are requests whose client went away.
    """

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    aborts: int = 0
    errors: int = 0
    rejected: int = 0
    embeddings: int = 0


@dataclass(slots=True)
class RequestRecord:
    """One scheduled request. Times are real seconds; ``arrival_unix`` orders replicas' records."""

    seq: int
    id: str
    endpoint: str
    arrival_unix: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_wait_s: float
    ttft_s: float | None
    e2e_s: float
    finish_reason: str
    x_request_id: str | None
    traceparent: str | None
    x_session_id: str | None
    authorization: str | None
    block_hashes: list[int]
    output_block_hashes: list[int]


@dataclass(slots=True)
class Stats:
    max_records: int
    totals: Totals = field(default_factory=Totals)
    records: deque[RequestRecord] = field(init=False)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    finish_reasons: dict[str, int] = field(default_factory=dict)
    decode_steps: int = 0
    busy_slot_steps: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    max_seq_tokens: int = 0

    def __post_init__(self) -> None:
        self.records = deque(maxlen=self.max_records)

    def add_record(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.finish_reasons[record.finish_reason] = (
            self.finish_reasons.get(record.finish_reason, 0) + 1
        )
        self.e2e.observe(record.e2e_s)
        self.queue_time.observe(record.queue_wait_s)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)

    def to_json(self, *, records: bool, hashes: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"totals": asdict(self.totals)}
        if records:
            rows = []
            for r in self.records:
                row = asdict(r)
                if not hashes:
                    del row["block_hashes"], row["output_block_hashes"]
                rows.append(row)
            out["records"] = rows
        return out
