"""Launch a fleet of simulator processes on free loopback ports, and stop them reliably.

    async with SimFleet(n=4, dialect="vllm", speedup=20) as fleet:
        ...  # fleet.urls: ["http://127.0.0.1:PORT", ...]

``with SimFleet(...)`` works too (for pytest fixtures). Extra keyword arguments become
simulator flags (``capacity_tokens=4096`` -> ``--capacity-tokens 4096``; ``True`` -> a bare
flag). ``dialect`` and ``model`` may be lists, one entry per replica, for mixed fleets.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 3.0
START_ATTEMPTS = 3


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_http_ok(
    url: str,
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll ``url`` with GET until it answers 200; TimeoutError after ``timeout_s``.

    ``alive`` lets a caller fail fast (RuntimeError) when the process behind the URL died.
    """
    deadline = time.monotonic() + timeout_s
    probe_timeout = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=probe_timeout) as session:
        while True:
            if alive is not None and not alive():
                raise RuntimeError(f"the server behind {url} exited")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s")
            await asyncio.sleep(interval_s)


def wait_http_ok_sync(
    url: str,
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Blocking twin of ``wait_http_ok`` for code without an event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None and not alive():
            raise RuntimeError(f"the server behind {url} exited")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s")
        time.sleep(interval_s)


def sim_flags(sim_args: dict[str, Any]) -> list[str]:
    """Keyword arguments as simulator command-line flags."""
    flags: list[str] = []
    for key, value in sim_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


class SimReplica:
    """One simulator process; its output goes to a temporary log shown if it fails."""

    def __init__(self, dialect: str, model: str, flags: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dialect = dialect
        self.model = model
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(_python_path())}
        cmd = [sys.executable, "-m", "loadtests.simulator", "--port", str(self.port)]
        cmd += ["--dialect", dialect, "--model", model, *flags]
        self.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, limit: int = 2000) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-limit:]

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class SimFleet:
    """N simulator replicas; started on enter, killed on exit (also on error)."""

    def __init__(
        self,
        n: int = 2,
        dialect: str | Sequence[str] = "vllm",
        model: str | Sequence[str] = "sim-model",
        *,
        startup_timeout_s: float = 20.0,
        **sim_args: Any,
    ) -> None:
        self.dialects = _per_replica(dialect, n, "dialect")
        self.models = _per_replica(model, n, "model")
        self.flags = sim_flags(sim_args)
        self.startup_timeout_s = startup_timeout_s
        self.replicas: list[SimReplica] = []

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def start(self) -> None:
        """Spawn the processes without waiting; ``wait_ready`` (or its sync twin) follows."""
        self.replicas = [
            SimReplica(d, m, self.flags) for d, m in zip(self.dialects, self.models, strict=True)
        ]

    async def wait_ready(self) -> None:
        await asyncio.gather(*(self._ready(i) for i in range(len(self.replicas))))

    def wait_ready_sync(self) -> None:
        for i in range(len(self.replicas)):
            for attempt in range(START_ATTEMPTS):
                r = self.replicas[i]
                try:
                    wait_http_ok_sync(r.url + "/health", self.startup_timeout_s, alive=r.alive)
                    break
                except (TimeoutError, RuntimeError) as e:
                    self._retry_or_raise(i, attempt, e)

    async def _ready(self, i: int) -> None:
        for attempt in range(START_ATTEMPTS):
            r = self.replicas[i]
            try:
                await wait_http_ok(r.url + "/health", self.startup_timeout_s, alive=r.alive)
                return
            except (TimeoutError, RuntimeError) as e:
                self._retry_or_raise(i, attempt, e)

    def _retry_or_raise(self, i: int, attempt: int, error: Exception) -> None:
        """Respawn a replica whose port was taken between ``free_port`` and its bind."""
        r = self.replicas[i]
        port_taken = not r.alive() and "address already in use" in r.log_tail().lower()
        if port_taken and attempt + 1 < START_ATTEMPTS:
            r.stop()
            self.replicas[i] = SimReplica(r.dialect, r.model, self.flags)
            return
        raise RuntimeError(f"simulator fleet failed to start: {error}\n{self._logs()}") from error

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()

    async def stats(self) -> list[dict[str, Any]]:
        """Every replica's /sim/stats, in replica order."""
        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(_get_stats(session, u) for u in self.urls)))

    async def reset(self) -> None:
        """Clear every replica's stats, cache and fault knobs."""
        async with aiohttp.ClientSession() as session:
            for url in self.urls:
                async with session.post(url + "/sim/reset") as resp:
                    resp.raise_for_status()

    async def set_faults(self, index: int, **knobs: Any) -> dict[str, Any]:
        """Change fault knobs of replica ``index`` (see loadtests.simulator.config.Faults)."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.urls[index] + "/sim/config", json=knobs) as resp,
        ):
            body = await resp.json()
            if resp.status != 200:
                raise ValueError(body.get("error", body))
            return body

    async def __aenter__(self) -> SimFleet:
        self.start()
        try:
            await self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __enter__(self) -> SimFleet:
        self.start()
        try:
            self.wait_ready_sync()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _logs(self) -> str:
        return "\n".join(f"--- {r.url} ({r.dialect})\n{r.log_tail()}" for r in self.replicas)


async def _get_stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/sim/stats") as resp:
        resp.raise_for_status()
        return await resp.json()


def _per_replica(value: str | Sequence[str], n: int, name: str) -> list[str]:
    if isinstance(value, str):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{name} lists {len(values)} entries for {n} replicas")
    return values


def _python_path() -> list[str]:
    existing = os.environ.get("PYTHONPATH")
    return [str(REPO_ROOT), *([existing] if existing else [])]
