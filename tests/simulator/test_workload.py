"""The agent-fleet workload: a deterministic plan, and a bounded driver over real sockets."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest

from loadtests.fleet import SimFleet
from loadtests.oracle import oracle_hit_rate, true_hit_rate
from loadtests.workload import WorkloadSpec, build_plan, percentile, run_workload

TINY = WorkloadSpec(
    sessions=4,
    turns=3,
    concurrency=2,
    one_shot_share=0.2,
    system_prompts=2,
    system_prompt_tokens=300,
    tools_per_prompt=2,
    user_tokens=(10, 30),
    tool_call_share=0.5,
    tool_result_tokens=(10, 40),
    max_tokens=8,
)


def test_plan_is_deterministic_per_seed() -> None:
    assert build_plan(TINY) == build_plan(TINY)
    other = build_plan(replace(TINY, seed=1))
    assert other != build_plan(TINY)


def test_plan_shape() -> None:
    plan = build_plan(TINY)
    multi = [s for s in plan.sessions if not s.one_shot]
    one_shots = [s for s in plan.sessions if s.one_shot]
    assert len(multi) == 4 and all(len(s.turns) == 3 for s in multi)
    assert len(one_shots) == 3, "20% of 15 requests"
    assert plan.requests == 15
    assert all(s.turns[0].kind == "user" for s in plan.sessions)
    assert all(len(a.system_prompt) >= 300 * 4 and len(a.tools) == 2 for a in plan.agents)
    tool_turns = [t for s in multi for t in s.turns if t.kind == "tool"]
    assert tool_turns and all(t.tool_name and t.tool_arguments for t in tool_turns)


def test_skewed_variant_sends_most_sessions_to_one_prompt() -> None:
    spec = WorkloadSpec(sessions=400, turns=1, one_shot_share=0.0, hot_prompt_share=0.7)
    shares = Counter(s.agent for s in build_plan(spec).sessions)
    assert 0.62 < shares[0] / 400 < 0.78
    uniform = Counter(s.agent for s in build_plan(WorkloadSpec(sessions=400, turns=1)).sessions)
    assert max(uniform.values()) / sum(uniform.values()) < 0.45


def test_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(one_shot_share=1.0)
    with pytest.raises(ValueError):
        WorkloadSpec(turns=0)
    with pytest.raises(ValueError):
        WorkloadSpec(hot_prompt_share=1.5)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([], 50) is None


@pytest.fixture(scope="module")
def pair() -> Iterator[SimFleet]:
    with SimFleet(n=2, dialect=["vllm", "llamacpp"], speedup=50) as fleet:
        yield fleet


async def test_workload_against_a_two_replica_fleet(pair: SimFleet) -> None:
    await pair.reset()
    progress: list[int] = []
    results = await asyncio.gather(
        *(
            run_workload(
                url,
                replace(TINY, seed=seed),
                model="sim-model",
                on_progress=lambda done, planned, record: progress.append(done),
                deadline_s=60,
            )
            for seed, url in enumerate(pair.urls)
        )
    )
    stats = await pair.stats()
    for result, replica in zip(results, stats, strict=True):
        summary = result.summary()
        assert summary.requests == summary.ok == result.planned == 15
        assert summary.errors == summary.skipped == 0 and not result.deadline_hit
        assert all(r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s for r in result.records)
        assert summary.ttft_p50_s <= summary.ttft_p99_s
        assert summary.e2e_p50_s <= summary.e2e_p99_s
        assert summary.req_per_s > 0 and summary.output_tokens_per_s > 0
        assert all(r.completion_tokens == 8 for r in result.records)
        assert replica["totals"]["requests"] == 15
        assert replica["totals"]["cached_tokens"] == summary.cached_tokens
        assert summary.reported_hit_rate == pytest.approx(true_hit_rate(replica["records"]))
        assert summary.reported_hit_rate > 0.3, "shared system prompts and growing histories"
        sessions = {r["x_session_id"] for r in replica["records"]}
        assert {f"s{i}" for i in range(4)} <= sessions and None in sessions, "one-shots unmarked"
        assert oracle_hit_rate(replica["records"], 16) >= true_hit_rate(replica["records"])
    assert sorted(progress) == sorted(list(range(1, 16)) * 2)


async def test_nonstream_workload(pair: SimFleet) -> None:
    spec = replace(TINY, sessions=2, one_shot_share=0.0)
    result = await run_workload(pair.urls[0], spec, model="sim-model", stream=False)
    assert result.summary().ok == 6
    assert all(r.cached_tokens <= r.prompt_tokens for r in result.records)


async def test_deadline_bounds_a_hanging_backend(pair: SimFleet) -> None:
    await pair.reset()
    await pair.set_faults(1, hang=True)
    try:
        result = await asyncio.wait_for(
            run_workload(pair.urls[1], TINY, model="sim-model", deadline_s=1.0), timeout=10
        )
    finally:
        await pair.reset()
    summary = result.summary()
    assert result.deadline_hit
    assert summary.ok == 0 and summary.errors == 2, "one in flight per worker"
    assert summary.skipped == 13


async def test_errors_end_the_session(pair: SimFleet) -> None:
    await pair.reset()
    await pair.set_faults(0, fail_next=1)
    spec = replace(TINY, sessions=1, concurrency=1, one_shot_share=0.0)
    result = await run_workload(pair.urls[0], spec, model="sim-model")
    assert [r.status for r in result.records] == [500]
    assert result.records[0].error.startswith("HTTP 500")
    assert result.skipped == 2 and not result.deadline_hit
