"""``prefix-proxy demo``: a simulated 4-replica fleet, the proxy in front of it, an agent-fleet
workload replayed once with round-robin and once with prefix-aware routing, and the table.

No GPU and no model: the replicas are the project's engine simulator (real processes with a
real prefix cache and a timing model), the proxy is the real ``prefix-proxy serve`` process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable

from loadtests.bench import SIM_ARGS, Row, agent_fleet_spec, format_table, measure
from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess
from loadtests.workload import RequestResult

POLICIES = ("round-robin", "default")


def run_demo(args: argparse.Namespace) -> int:
    return asyncio.run(_demo(args))


async def _demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    spec = agent_fleet_spec(sessions=args.sessions, turns=args.turns)
    budget = args.seconds / len(POLICIES)
    print(
        f"prefix-proxy demo: {args.replicas} simulated replicas, {spec.sessions} agent sessions x "
        f"{spec.turns} turns (+ one-shots), concurrency {spec.concurrency}",
        flush=True,
    )
    rows: list[Row] = []
    async with SimFleet(n=args.replicas, dialect="vllm", model="sim-model", **SIM_ARGS) as fleet:
        for policy in POLICIES:
            async with ProxyProcess(fleet.urls, policy=policy) as proxy:
                row = await measure(
                    f"prefix-proxy {policy}",
                    proxy.url,
                    fleet,
                    spec,
                    deadline_s=budget,
                    on_progress=_progress(policy, started),
                )
            print(file=sys.stderr, flush=True)
            rows.append(row)
    print()
    print(format_table(rows))
    rr, pp = rows
    if rr.ttft_p50_ms and pp.ttft_p50_ms:
        print(
            f"\nprefix-aware vs round-robin: hit rate {pp.hit_rate:.1%} vs {rr.hit_rate:.1%}, "
            f"TTFT p50 {rr.ttft_p50_ms / pp.ttft_p50_ms:.1f}x lower, "
            f"p99 {rr.ttft_p99_ms / pp.ttft_p99_ms:.1f}x lower "
            f"({time.monotonic() - started:.0f} s in all)"
        )
    return 0 if all(r.errors == 0 for r in rows) else 1


def _progress(policy: str, started: float) -> Callable[[int, int, RequestResult], None]:
    def show(done: int, total: int, _last: RequestResult) -> None:
        if done % 10 == 0 or done == total:
            line = f"  {policy:<12} {done:>4}/{total} requests  {time.monotonic() - started:5.1f} s"
            end = "\r" if sys.stderr.isatty() else "\n"
            if sys.stderr.isatty() or done == total or done % 100 == 0:
                print(line, end=end, file=sys.stderr, flush=True)

    return show
