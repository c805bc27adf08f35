"""Proxy overhead close to the wire: the same zero-latency backend hit directly, through
prefix-proxy, and through sglang-router (when installed), at several concurrencies, with
non-streaming requests and with streams of N SSE chunks. Load comes from ``wrk`` (Debian
package ``wrk``), a C load generator, so the client is not the bottleneck.

    python -m loadtests.bench_overhead                      # ~3 minutes
    python -m loadtests.bench_overhead --seconds 5 --concurrency 64

Columns: requests/s; latency p50/p99 as wrk measures it; added p50/p99 = that percentile
through the router minus the same percentile direct (a difference of percentiles, not a
percentile of differences); SSE chunks/s forwarded; the router process's CPU time per
request (user + system, from /proc). Then the routing path alone (parse + render + hash +
decide) for chat prompts of 1k to 128k tokens (loadtests.bench_decision).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from loadtests.peers import SglangRouter, sglang_router_available
from loadtests.proxy_process import ProxyProcess
from loadtests.zero_backend import ZeroBackend

CHUNKS = 64
PROMPT = "Summarise the incident report in two sentences. " * 40  # ~500 tokens


@dataclass(frozen=True, slots=True)
class Run:
    target: str
    mode: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_req: float | None


def wrk(
    url: str, stream: bool, concurrency: int, seconds: float
) -> tuple[float, float, float, int]:
    """(requests/s, p50 ms, p99 ms, requests) from one wrk run."""
    body = orjson.dumps(
        {"model": "zero-model", "messages": [{"role": "user", "content": PROMPT}], "stream": stream}
    ).decode()
    script = (
        'wrk.method = "POST"\n'
        f"wrk.body = {orjson.dumps(body).decode()}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        threads = 1 if concurrency < 4 else 2
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
             "--latency", "-s", f.name, url + "/v1/chat/completions"],
            capture_output=True, text=True, check=True, timeout=seconds + 30,
        ).stdout  # fmt: skip
    finally:
        os.unlink(f.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} non-2xx responses\n{out}")
    return rps, _pct(out, "50%"), _pct(out, "99%"), total


def _pct(out: str, label: str) -> float:
    m = re.search(rf"^\s+{re.escape(label)}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    if m is None:
        raise RuntimeError(f"no {label} in wrk output:\n{out}")
    return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(target: str, url: str, pid: int | None, args: argparse.Namespace) -> list[Run]:
    runs = []
    for mode in ("json", "stream"):
        for c in args.concurrency:
            wrk(url, mode == "stream", c, 1)  # warm the connection pools and caches
            before = cpu_seconds(pid) if pid else 0.0
            rps, p50, p99, total = wrk(url, mode == "stream", c, args.seconds)
            cpu = (cpu_seconds(pid) - before) / total * 1000.0 if pid and total else None
            runs.append(Run(target, mode, c, rps, p50, p99, cpu))
            print(
                f"  {target:<14} {mode:<6} c={c:<4} {rps:>8.0f} req/s", file=sys.stderr, flush=True
            )
    return runs


def table(runs: list[Run]) -> str:
    direct = {(r.mode, r.concurrency): r for r in runs if r.target == "direct"}
    head = (
        f"{'target':<14} {'mode':<6} {'conc':>4} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'+p50 ms':>8} {'+p99 ms':>8} {'chunks/s':>9} {'CPU ms/req':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        d = direct[(r.mode, r.concurrency)]
        added = (r.p50_ms - d.p50_ms, r.p99_ms - d.p99_ms) if r.target != "direct" else None
        chunks = f"{r.rps * (CHUNKS + 1):>9.0f}" if r.mode == "stream" else f"{'-':>9}"
        lines.append(
            f"{r.target:<14} {r.mode:<6} {r.concurrency:>4} {r.rps:>8.0f} {r.p50_ms:>7.2f} "
            f"{r.p99_ms:>7.2f} "
            + (f"{added[0]:>8.2f} {added[1]:>8.2f} " if added else f"{'-':>8} {'-':>8} ")
            + f"{chunks} "
            + (f"{r.cpu_ms_per_req:>10.3f}" if r.cpu_ms_per_req is not None else f"{'-':>10}")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 256]
    )
    p.add_argument("--no-peers", dest="peers", action="store_false")
    p.add_argument("--no-routing-path", dest="routing_path", action="store_false")
    args = p.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    runs: list[Run] = []
    with ZeroBackend(CHUNKS) as url:
        runs += measure("direct", url, None, args)
        with ProxyProcess(
            [url], policy="default", config={"telemetry": {"debug_header": False}}
        ) as proxy:
            assert proxy.proc is not None
            runs += measure("prefix-proxy", proxy.url, proxy.proc.pid, args)
        if args.peers and sglang_router_available():
            runs += asyncio.run(_peer(url, args))
    print(
        f"\nzero-latency backend, {CHUNKS} SSE chunks per stream, ~500-token prompt, "
        f"{os.cpu_count()} CPUs, wrk {args.seconds:.0f} s per cell"
    )
    print(table(runs))
    ours = {(r.mode, r.concurrency): r for r in runs if r.target == "prefix-proxy"}
    peer = {(r.mode, r.concurrency): r for r in runs if r.target == "sglang-router"}
    if peer:
        ratios = [
            f"{m} c={c}: {ours[(m, c)].rps / peer[(m, c)].rps:.2f}"
            for (m, c) in ours
            if (m, c) in peer
        ]
        print("\nprefix-proxy / sglang-router throughput ratio: " + ", ".join(ratios))
    if args.routing_path:
        from loadtests.bench_decision import bench_path

        print()
        bench_path("Qwen/Qwen2.5-7B-Instruct", "default", 128)
    return 0


async def _peer(url: str, args: argparse.Namespace) -> list[Run]:
    async with SglangRouter([url], "round_robin") as router:
        assert router.proc is not None
        return await asyncio.to_thread(measure, "sglang-router", router.url, router.proc.pid, args)


if __name__ == "__main__":
    sys.exit(main())
