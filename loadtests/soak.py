"""Sustained load: many concurrent streaming sessions through one proxy process.

Each session streams a chat completion, reads it to the end, thinks for a moment, and goes
again, until the time is up. The report counts every request (a request that did not end
with ``data: [DONE]`` is an error), samples the proxy's resident memory, and measures the
latency the proxy adds: client-side end-to-end time minus the engine's own (the simulator
records each request's server-side duration under its X-Request-ID).

    python -m loadtests.soak --sessions 500 --seconds 600     # the 10-minute soak, by hand
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from loadtests.fleet import SimFleet
from loadtests.proxy_process import ProxyProcess
from loadtests.workload import percentile


@dataclass(slots=True)
class SoakResult:
    sessions: int
    seconds: float
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    rss_kib: list[tuple[float, int]] = field(default_factory=list)
    added_ms: list[float] = field(default_factory=list)
    chunks: int = 0

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def rss_growth_kib(self) -> int:
        """Resident memory at the end minus after the first 10% of the run (warm-up)."""
        if len(self.rss_kib) < 2:
            return 0
        warm = next((kib for t, kib in self.rss_kib if t >= self.seconds * 0.1), self.rss_kib[0][1])
        return self.rss_kib[-1][1] - warm

    def report(self) -> str:
        added = sorted(self.added_ms)
        p50, p99 = percentile(added, 50), percentile(added, 99)
        return (
            f"{self.sessions} sessions x {self.seconds:.0f} s: {self.requests} requests, "
            f"{self.failed} failed {self.errors or ''}, {self.chunks} SSE chunks, "
            f"RSS {self.rss_kib[0][1] / 1024:.0f} -> {self.rss_kib[-1][1] / 1024:.0f} MiB "
            f"(growth after warm-up {self.rss_growth_kib() / 1024:+.1f} MiB), added latency "
            f"p50 {p50 or 0:.2f} ms p99 {p99 or 0:.2f} ms"
        )


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def run_soak(
    sessions: int = 500,
    seconds: float = 120.0,
    replicas: int = 4,
    max_tokens: int = 12,
    think_s: tuple[float, float] = (0.2, 1.0),
) -> SoakResult:
    result = SoakResult(sessions=sessions, seconds=seconds)
    sim = {"speedup": 1.0, "decode_ms_per_token": 40.0, "max_running": 256}
    async with SimFleet(n=replicas, **sim) as fleet:
        with ProxyProcess(fleet.urls, config={"limits": {"drain_timeout_s": 5.0}}) as proxy:
            assert proxy.proc is not None
            pid = proxy.proc.pid
            started = time.monotonic()
            deadline = started + seconds
            client_e2e: dict[str, float] = {}
            rng = random.Random(1)
            connector = aiohttp.TCPConnector(limit=sessions + 16)
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

                async def session(i: int) -> None:
                    history = [{"role": "system", "content": f"Agent {i % 7}. " + "rules " * 200}]
                    turn = 0
                    await asyncio.sleep(rng.uniform(0, think_s[1]))
                    while time.monotonic() < deadline:
                        turn += 1
                        rid = f"soak-{i}-{turn}"
                        history.append({"role": "user", "content": f"step {turn} of task {i}"})
                        body = {"model": "sim-model", "messages": history, "stream": True,
                                "max_tokens": max_tokens}  # fmt: skip
                        t0 = time.monotonic()
                        try:
                            async with http.post(
                                proxy.url + "/v1/chat/completions",
                                json=body,
                                headers={"X-Request-ID": rid, "X-Session-ID": f"s{i}"},
                            ) as r:
                                data = await r.read()
                            ok = r.status == 200 and data.rstrip().endswith(b"data: [DONE]")
                            kind = (
                                "ok"
                                if ok
                                else f"status_{r.status}"
                                if r.status != 200
                                else "truncated"
                            )
                        except (aiohttp.ClientError, TimeoutError) as e:
                            kind, data = type(e).__name__, b""
                        result.requests += 1
                        if kind != "ok":
                            result.errors[kind] = result.errors.get(kind, 0) + 1
                        else:
                            client_e2e[rid] = time.monotonic() - t0
                            result.chunks += data.count(b"\n\ndata: ") + 1
                        history.append({"role": "assistant", "content": "ok"})
                        if len(history) > 40:
                            del history[1:3]
                        await asyncio.sleep(rng.uniform(*think_s))

                async def sample_memory() -> None:
                    while time.monotonic() < deadline:
                        result.rss_kib.append((time.monotonic() - started, _rss_kib(pid)))
                        await asyncio.sleep(1.0)

                result.rss_kib.append((0.0, _rss_kib(pid)))
                await asyncio.gather(sample_memory(), *(session(i) for i in range(sessions)))
                result.rss_kib.append((time.monotonic() - started, _rss_kib(pid)))
            stats = await fleet.stats()
    server = {
        r["x_request_id"]: r["e2e_s"]
        for s in stats
        for r in s.get("records", [])
        if r["x_request_id"]
    }
    result.added_ms = [
        (client_e2e[rid] - server[rid]) * 1000.0 for rid in client_e2e if rid in server
    ]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sessions", type=int, default=500)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--replicas", type=int, default=4)
    args = p.parse_args(argv)
    result = asyncio.run(run_soak(args.sessions, args.seconds, args.replicas))
    print(result.report())
    return 0 if result.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
