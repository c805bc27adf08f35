"""Peer routers run on loopback beside ours, for side-by-side numbers (PyPI sglang-router)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile

from loadtests.fleet import free_port, wait_http_ok


def sglang_router_available() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


class SglangRouter:
    """``python -m sglang_router.launch_router`` in front of ``workers`` with one policy."""

    def __init__(self, workers: list[str], policy: str) -> None:
        self.workers = workers
        self.policy = policy
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __aexit__
        self.proc: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> SglangRouter:
        cmd = [
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *self.workers,
            "--policy", self.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            await wait_http_ok(
                self.url + "/v1/models", 60.0, alive=lambda: self.proc.poll() is None
            )
        except (TimeoutError, RuntimeError) as e:
            await self.__aexit__()
            raise RuntimeError(f"sglang-router did not start: {e}\n{self.log_tail()}") from e
        return self

    def log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-3000:]

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
