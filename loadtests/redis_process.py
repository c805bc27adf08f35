"""A throwaway redis-server on a free loopback port, for benchmarks and the demo of cluster
mode (the tests have their own fixture with kill/restart/freeze knobs)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import redis

from loadtests.fleet import free_port


class RedisProcess:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed (Debian: apt-get install redis-server)"
            )
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="prefix-proxy-redis-")
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self._dir.name,
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def __enter__(self) -> RedisProcess:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            for _ in range(100):
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.__exit__()
        raise RuntimeError("redis-server did not answer PING within 5 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._dir.cleanup()
