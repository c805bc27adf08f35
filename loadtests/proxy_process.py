"""Run the proxy as a real process (``python -m proxy.cli serve``) on a free loopback port.

Used by the integration tests, the demo and the benchmarks, so that everything measures the
same thing a user runs: the command, its config file, its sockets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from loadtests.fleet import free_port, wait_http_ok, wait_http_ok_sync

REPO = Path(__file__).resolve().parent.parent


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class ProxyProcess:
    """``with ProxyProcess(backends, policy="default") as p: p.url`` (or ``async with``)."""

    def __init__(
        self,
        backends: list[str],
        policy: str | dict[str, Any] = "default",
        config: dict[str, Any] | None = None,
        workers: int = 1,
        env: dict[str, str] | None = None,
        log_level: str = "WARNING",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = {
            "listen": {"host": "127.0.0.1", "port": self.port, "workers": workers},
            "backends": {"static": backends},
            "policy": policy,
            "health": {"interval_s": 0.5, "timeout_s": 1.0},
            "scrape": {"interval_s": 0.25, "timeout_s": 1.0, "stale_after_s": 2.0},
            "limits": {"drain_timeout_s": 5.0},
            "telemetry": {"access_log": False, "debug_header": True},
        }
        self.config = _merge(base, config or {})
        self._dir = tempfile.TemporaryDirectory(prefix="prefix-proxy-")
        self.config_path = Path(self._dir.name) / "config.yaml"
        self.log_path = Path(self._dir.name) / "proxy.log"
        self.env = env
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self, config: dict[str, Any] | None = None) -> None:
        if config is not None:
            self.config = config
        self.config_path.write_text(yaml.safe_dump(self.config))

    def start(self) -> None:
        self.write_config()
        env = {**os.environ, **(self.env or {})}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proxy.cli",
                "serve",
                "--config",
                str(self.config_path),
                "--log-level",
                self.log_level,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> ProxyProcess:
        self.start()
        try:
            wait_http_ok_sync(self.url + "/health", 20.0, alive=self.alive)
        except (TimeoutError, RuntimeError) as e:
            logs = self.logs()
            self.close()
            raise RuntimeError(f"proxy did not start: {e}\n{logs}") from e
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ProxyProcess:
        self.start()
        try:
            await wait_http_ok(self.url + "/health", 20.0, alive=self.alive)
        except (TimeoutError, RuntimeError) as e:
            logs = self.logs()
            self.close()
            raise RuntimeError(f"proxy did not start: {e}\n{logs}") from e
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
