"""One engine server process on a loopback port: start it, wait until healthy, stop it."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class EngineStartError(RuntimeError):
    """The engine exited or never became healthy; the message carries its log tail."""


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free, all held open together so none is handed out twice."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills it if the starting process dies first."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path, chars: int = 4000) -> str:
    """The end of a log file, for error messages."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class Replica:
    """A started engine process and where it listens."""

    port: int
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @classmethod
    async def start(
        cls, argv: list[str], port: int, log_path: Path, env: dict[str, str] | None = None
    ) -> Replica:
        """Spawn `argv` in its own process group, output to `log_path`; never outlive us."""
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return cls(port=port, process=process, log_path=log_path)

    async def wait_healthy(self, timeout: float, path: str = "/health") -> None:
        """Poll `path` until it answers 200; fail early if the process dies."""
        deadline = time.monotonic() + timeout
        probe_timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=probe_timeout) as session:
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    raise EngineStartError(
                        f"engine on port {self.port} exited with {self.process.returncode}:\n"
                        + log_tail(self.log_path)
                    )
                try:
                    async with session.get(self.url + path) as response:
                        if response.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)
        raise EngineStartError(
            f"engine on port {self.port} not healthy after {timeout:.0f}s:\n"
            + log_tail(self.log_path)
        )

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after `grace` seconds."""
        if self.process.returncode is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            await asyncio.wait_for(self.process.wait(), grace)
        except TimeoutError:
            os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()
        except ProcessLookupError:
            await self.process.wait()

    def rss_bytes(self) -> int:
        """Resident memory of the replica's whole process group (engines fork workers)."""
        page = os.sysconf("SC_PAGE_SIZE")
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == self.process.pid:
                total += int(fields[21]) * page
        return total
