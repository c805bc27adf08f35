"""A group of engine replicas started together and stopped together."""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from loadtests.engines.replica import Replica, free_ports


class Fleet:
    """`n` replicas of one engine on free loopback ports; subclasses say how to launch one.

    Use as `async with SomeFleet(...) as fleet:` then `fleet.urls`; every replica is healthy
    inside the block and stopped after it. Logs live in a temporary folder until then.
    """

    name = "engine"

    def __init__(self, n: int, startup_timeout: float) -> None:
        self.n = n
        self.startup_timeout = startup_timeout
        self.replicas: list[Replica] = []
        self._log_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def urls(self) -> list[str]:
        return [replica.url for replica in self.replicas]

    async def prepare(self) -> None:
        """Find or make what the replicas need (binary, model) before any starts."""

    def argv(self, port: int) -> list[str]:
        """The command line of the replica listening on `port`."""
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        """The replicas' environment (None: inherit this process's)."""
        return None

    async def __aenter__(self) -> Self:
        self._log_dir = tempfile.TemporaryDirectory(prefix=f"{self.name}-fleet-")
        log_dir = Path(self._log_dir.name)
        try:
            await self.prepare()
            for index, port in enumerate(free_ports(self.n)):
                log_path = log_dir / f"replica-{index}.log"
                self.replicas.append(
                    await Replica.start(self.argv(port), port, log_path, self.env())
                )
            await asyncio.gather(
                *(replica.wait_healthy(self.startup_timeout) for replica in self.replicas)
            )
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop every replica and drop their logs."""
        await asyncio.gather(*(replica.stop() for replica in self.replicas))
        self.replicas.clear()
        if self._log_dir is not None:
            self._log_dir.cleanup()
            self._log_dir = None


async def serve_until_stopped(fleet: Fleet) -> None:
    """Run ``fleet`` until SIGTERM (or Ctrl-C in the caller), printing where it listens."""
    started = time.monotonic()
    async with fleet:
        print(f"{len(fleet.replicas)} replicas healthy in {time.monotonic() - started:.1f}s")
        for replica in fleet.replicas:
            print(f"  {replica.url}  rss {replica.rss_bytes() / 2**20:.1f} MiB", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
