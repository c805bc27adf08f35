"""Cluster mode benchmark: does routing stay as good with several proxy replicas?

Three setups in front of the same simulated fleet, replaying the agent-fleet workload with
every request sent to a proxy picked at random (as a Kubernetes Service would):
one proxy; three proxies that share nothing; three proxies sharing prefix ownership through
Redis. Then one proxy process with --workers 1 against --workers 2 (sharing through Redis)
on a zero-latency backend, measured with wrk.

    python -m loadtests.bench_cluster        # ~3 minutes; needs redis-server and wrk
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys

from loadtests.bench import SIM_ARGS, Row, agent_fleet_spec, format_table, measure
from loadtests.bench_overhead import wrk
from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess
from loadtests.redis_process import RedisProcess
from loadtests.zero_backend import ZeroBackend


async def routing_rows(args: argparse.Namespace) -> list[Row]:
    spec = agent_fleet_spec(sessions=args.sessions)
    rows = []
    async with SimFleet(n=args.replicas, dialect="vllm", model="sim-model", **SIM_ARGS) as fleet:
        with ProxyProcess(fleet.urls) as one:
            rows.append(await measure("1 proxy", one.url, fleet, spec, deadline_s=300))
        with contextlib.ExitStack() as stack:
            proxies = [stack.enter_context(ProxyProcess(fleet.urls)) for _ in range(3)]
            rows.append(
                await measure(
                    "3 proxies, no sync", [p.url for p in proxies], fleet, spec, deadline_s=300
                )
            )
        with RedisProcess() as redis, contextlib.ExitStack() as stack:
            cfg = {"cluster": {"redis_url": redis.url}}
            proxies = [stack.enter_context(ProxyProcess(fleet.urls, config=cfg)) for _ in range(3)]
            await asyncio.sleep(1.0)  # let every node connect before traffic
            rows.append(
                await measure(
                    "3 proxies, Redis sync", [p.url for p in proxies], fleet, spec, deadline_s=300
                )
            )
    return rows


def workers_table(seconds: float) -> str:
    lines = [f"{'proxy process':<28} {'conc':>4} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7}"]
    with ZeroBackend() as url, RedisProcess() as redis:
        for workers in (1, 2):
            cfg = {"cluster": {"redis_url": redis.url}} if workers > 1 else {}
            with ProxyProcess([url], config=cfg, workers=workers) as proxy:
                wrk(proxy.url, False, 64, 2)  # warm-up; lets the second worker come up
                rps, p50, p99, _ = wrk(proxy.url, False, 64, seconds)
            lines.append(
                f"{f'--workers {workers}':<28} {64:>4} {rps:>8.0f} {p50:>7.2f} {p99:>7.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--sessions", type=int, default=40)
    p.add_argument("--seconds", type=float, default=8.0, help="wrk time for the workers table")
    args = p.parse_args(argv)
    rows = asyncio.run(routing_rows(args))
    print(
        f"\n== agent-fleet workload, {args.replicas} simulated replicas, requests spread at random"
    )
    print(format_table(rows))
    single, synced = rows[0], rows[2]
    print(
        f"\nhit rate with sync {synced.hit_rate:.1%} vs one proxy {single.hit_rate:.1%}: "
        f"{(single.hit_rate - synced.hit_rate) * 100:+.1f} points"
    )
    if shutil.which("wrk"):
        print("\n== zero-latency backend, non-streaming, wrk")
        print(workers_table(args.seconds))
    else:
        print("wrk not installed: workers table skipped (apt-get install wrk)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
