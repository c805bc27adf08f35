"""Shared benchmark harness: run a workload through a router in front of a simulator fleet
and turn the replicas' own records into one honest row of numbers.

The hit rate is the simulator's (tokens it really served from cache), the oracle is
computed from the same records (loadtests.oracle), TTFT and end-to-end latency are measured
by the client, and imbalance is the busiest replica's share of requests over the mean.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadtests.fleet import SimFleet
from loadtests.oracle import oracle_hit_rate, true_hit_rate
from loadtests.workload import RequestResult, WorkloadSpec, run_workload

# Timing of an 8B-class model on one mid-range GPU: prefill ~100 ms per 1k uncached tokens,
# a decode step ~10 ms (+0.25 ms per running sequence), 16 sequences per batch, 128k tokens
# of KV cache per replica in 16-token blocks.
SIM_ARGS: dict[str, Any] = {
    "block_tokens": 16,
    "capacity_tokens": 131072,
    "max_running": 16,
    "prefill_ms_per_1k_tokens": 100.0,
    "decode_ms_per_token": 10.0,
}


def agent_fleet_spec(**overrides: Any) -> WorkloadSpec:
    """The agent-fleet workload of the demo and benchmarks: 3 agents with 1.5k-token system
    prompts and tools, conversations of 8 turns where half the turns carry a tool result of
    200-1500 tokens (prompts reach ~4-8k tokens), 10% one-shot requests."""
    base: dict[str, Any] = {
        "sessions": 40,
        "turns": 8,
        "concurrency": 16,
        "system_prompts": 3,
        "system_prompt_tokens": 1500,
        "tool_result_tokens": (200, 1500),
        "tool_call_share": 0.5,
        "user_tokens": (40, 200),
        "max_tokens": 24,
        "seed": 7,
    }
    return WorkloadSpec(**(base | overrides))


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    requests: int
    errors: int
    hit_rate: float
    oracle: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    req_per_s: float
    imbalance: float
    per_replica: tuple[int, ...]
    ttfts_ms: tuple[float, ...] = ()
    replica_arrivals_s: tuple[tuple[float, ...], ...] = ()

    @property
    def of_oracle(self) -> float:
        return self.hit_rate / self.oracle if self.oracle else 0.0


async def measure(
    name: str,
    url: str | list[str],
    fleet: SimFleet,
    spec: WorkloadSpec,
    *,
    model: str = "sim-model",
    deadline_s: float = 120.0,
    on_progress: Callable[[int, int, RequestResult], None] | None = None,
) -> Row:
    """Reset the fleet, replay ``spec`` through ``url`` (or spread over several), and read
    back what the replicas did."""
    await fleet.reset()
    result = await run_workload(
        url, spec, model=model, on_progress=on_progress, deadline_s=deadline_s
    )
    stats = await fleet.stats()
    records = [r for s in stats for r in s.get("records", [])]
    block_tokens = stats[0]["block_tokens"] if stats else 16
    per_replica = tuple(len(s.get("records", [])) for s in stats)
    mean = statistics.fmean(per_replica) if per_replica else 0.0
    summary = result.summary()

    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1000.0

    first = min((r["arrival_unix"] for r in records), default=0.0)

    return Row(
        name=name,
        requests=summary.requests,
        errors=summary.errors + summary.skipped,
        hit_rate=true_hit_rate(records),
        oracle=oracle_hit_rate(records, block_tokens),
        ttft_p50_ms=ms(summary.ttft_p50_s),
        ttft_p99_ms=ms(summary.ttft_p99_s),
        e2e_p50_ms=ms(summary.e2e_p50_s),
        e2e_p99_ms=ms(summary.e2e_p99_s),
        req_per_s=summary.req_per_s,
        imbalance=max(per_replica) / mean if mean else 0.0,
        per_replica=per_replica,
        ttfts_ms=tuple(r.ttft_s * 1000.0 for r in result.records if r.ok and r.ttft_s is not None),
        replica_arrivals_s=tuple(
            tuple(r["arrival_unix"] - first for r in s.get("records", [])) for s in stats
        ),
    )


HEADER = (
    f"{'router':<28} {'reqs':>5} {'err':>4} {'hit rate':>8} {'oracle':>7} {'of oracle':>9} "
    f"{'TTFT p50':>9} {'TTFT p99':>9} {'e2e p50':>8} {'e2e p99':>8} {'req/s':>6} {'imbal':>6}"
    f"  requests per replica"
)


def format_row(r: Row) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}ms"

    return (
        f"{r.name:<28} {r.requests:>5} {r.errors:>4} {r.hit_rate:>8.1%} {r.oracle:>7.1%} "
        f"{r.of_oracle:>9.1%} {f(r.ttft_p50_ms):>9} {f(r.ttft_p99_ms):>9} {f(r.e2e_p50_ms):>8} "
        f"{f(r.e2e_p99_ms):>8} {r.req_per_s:>6.1f} {r.imbalance:>6.2f}"
        f"  {'/'.join(map(str, r.per_replica))}"
    )


def format_table(rows: list[Row]) -> str:
    return "\n".join([HEADER, "-" * len(HEADER), *map(format_row, rows)])
