"""The fleet harness itself: replicas stop with the fleet, fail loudly, never outlive us."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from loadtests.engines.replica import EngineStartError
from tests.engines.conftest import FleetFactory

pytestmark = pytest.mark.engines
REPO_ROOT = Path(__file__).resolve().parents[2]

STARTER = """
import asyncio, sys
from pathlib import Path
from loadtests.engines.llamacpp import LlamaFleet

async def main():
    async with LlamaFleet(2, binary=Path(sys.argv[1]), model=Path(sys.argv[2])) as fleet:
        print(*(replica.process.pid for replica in fleet.replicas), flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def test_fleet_stops_every_replica(
    llama_fleet_factory: FleetFactory, http_session: aiohttp.ClientSession
) -> None:
    async with llama_fleet_factory(n=2) as fleet:
        replicas = list(fleet.replicas)
        assert all(replica.rss_bytes() > 0 for replica in replicas)
    assert all(replica.process.returncode is not None for replica in replicas)
    assert fleet.replicas == []
    with pytest.raises(aiohttp.ClientConnectionError):
        await http_session.get(replicas[0].url + "/health")


async def test_bad_model_fails_start_with_the_log(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file")
    fleet = llama_fleet_factory(n=1, model=garbage)
    with pytest.raises(EngineStartError, match="exited"):
        async with fleet:
            pass
    assert fleet.replicas == []


def test_replicas_die_with_a_killed_starter(llama_server_bin: Path, tiny_gguf: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(llama_server_bin), str(tiny_gguf)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        pids = [int(pid) for pid in starter.stdout.readline().split()]
        assert len(pids) == 2
        assert all(alive(pid) for pid in pids)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in pids if alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
