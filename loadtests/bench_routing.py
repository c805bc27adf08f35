"""Routing benchmark: every policy preset (and sglang-router, when installed) in front of the
same simulated fleet, on the balanced and the skewed agent-fleet workload.

    python -m loadtests.bench_routing            # ~10 minutes on 2 cores
    python -m loadtests.bench_routing --quick    # fewer sessions, two presets

Prints one table per workload and writes the rows as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

from loadtests.bench import SIM_ARGS, Row, agent_fleet_spec, format_table, measure
from loadtests.fleet import SimFleet
from loadtests.peers import SglangRouter, sglang_router_available
from loadtests.proxy_process import ProxyProcess
from loadtests.workload import WorkloadSpec

PRESETS = ("round-robin", "least-load", "session-sticky", "throughput", "agent-fleet", "default")
PEER_POLICIES = ("round_robin", "cache_aware")


async def run(args: argparse.Namespace) -> dict[str, list[Row]]:
    presets = args.presets.split(",") if args.presets else list(PRESETS)
    workloads = {
        "balanced": agent_fleet_spec(sessions=args.sessions),
        "skewed (70% one system prompt)": agent_fleet_spec(
            sessions=args.sessions, hot_prompt_share=0.7
        ),
    }
    peers = args.peers and sglang_router_available()
    if args.peers and not peers:
        print("sglang-router is not installed: peers skipped (pip install sglang-router)")
    results: dict[str, list[Row]] = {}
    # SGLang-dialect simulators: sglang-router probes /server_info and /model_info.
    async with SimFleet(n=args.replicas, dialect="sglang", model="sim-model", **SIM_ARGS) as fleet:
        for wname, spec in workloads.items():
            rows: list[Row] = []
            for preset in presets:
                async with ProxyProcess(fleet.urls, policy=preset) as proxy:
                    rows.append(await _measure(f"prefix-proxy {preset}", proxy.url, fleet, spec))
            if peers:
                for policy in PEER_POLICIES:
                    try:
                        async with SglangRouter(fleet.urls, policy) as router:
                            rows.append(
                                await _measure(f"sglang-router {policy}", router.url, fleet, spec)
                            )
                    except RuntimeError as e:
                        print(f"sglang-router {policy} failed: {e}", file=sys.stderr)
            results[wname] = rows
            print(
                f"\n== {wname}: {args.replicas} replicas, {spec.sessions} sessions x "
                f"{spec.turns} turns, concurrency {spec.concurrency}"
            )
            print(format_table(rows), flush=True)
    return results


async def _measure(name: str, url: str, fleet: SimFleet, spec: WorkloadSpec) -> Row:
    t0 = time.monotonic()
    row = await measure(name, url, fleet, spec, deadline_s=300.0)
    print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--sessions", type=int, default=40)
    p.add_argument("--presets", help="comma-separated subset of presets")
    p.add_argument("--no-peers", dest="peers", action="store_false")
    p.add_argument("--quick", action="store_true", help="20 sessions, round-robin and default")
    p.add_argument("--out", default="reports/bench_routing.json")
    p.add_argument("--charts", action="store_true", help="also write PNG charts (matplotlib)")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions = 20
        args.presets = args.presets or "round-robin,default"
    results = asyncio.run(run(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results_doc = {
        w: [dataclasses.asdict(r) | {"of_oracle": r.of_oracle} for r in rows]
        for w, rows in results.items()
    }
    out.write_text(json.dumps(results_doc))
    print(f"\nrows written to {out}")
    if args.charts:
        from loadtests.charts import load_results, write_charts

        for path in write_charts(load_results(out), out.parent):
            print(f"chart: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
