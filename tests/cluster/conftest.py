"""Real redis-server processes on 127.0.0.1 for the cluster sync tests."""

from __future__ import annotations

import asyncio
import ctypes
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis

from loadtests.fleet import free_port

REDIS_SERVER = shutil.which("redis-server")
OPENSSL = shutil.which("openssl")
PR_SET_PDEATHSIG = 1


class RedisServer:
    """One redis-server process that a test can kill and start again on the same port."""

    def __init__(self, workdir: Path, *extra: str, tls: bool = False) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.extra = extra
        self.tls = tls
        self.password: str | None = None
        if "--requirepass" in extra:
            self.password = extra[extra.index("--requirepass") + 1]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def cert(self) -> Path:
        return self.workdir / "cert.pem"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.cert}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        args = [REDIS_SERVER, "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        args += ["--save", "", "--appendonly", "no"]
        if self.tls:
            key = self.workdir / "key.pem"
            if not self.cert.exists():
                self_signed_cert(self.cert, key)
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", str(self.cert), "--tls-key-file", str(key)]
        else:
            args += ["--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*args, *self.extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        self.wait_ready()

    def wait_ready(self) -> None:
        client = self.client(socket_timeout=1)
        try:
            for _ in range(100):
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    time.sleep(0.05)
            raise RuntimeError("redis-server did not answer PING within 5 s")
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None

    def pause(self) -> None:
        """Freeze the server: connections stay open, nothing answers (a slow Redis)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def client(self, **kwargs: object) -> redis.Redis:
        if self.tls:
            kwargs |= {"ssl": True, "ssl_ca_certs": str(self.cert)}
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kwargs)


def _die_with_parent() -> None:
    """Linux: the server gets SIGKILL if pytest itself is killed, so none outlives a run."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def self_signed_cert(cert: Path, key: Path) -> None:
    if OPENSSL is None:
        pytest.skip("openssl is not installed: cannot make a TLS certificate")
    subprocess.run(
        [
            *(OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Factory: ``redis_server("--requirepass", "x")`` starts a fresh server on a free port."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    servers: list[RedisServer] = []

    def make(*extra: str, tls: bool = False) -> RedisServer:
        server = RedisServer(tmp_path, *extra, tls=tls)
        servers.append(server)
        server.start()
        return server

    yield make
    for s in servers:
        s.kill()


class Relay:
    """A TCP relay in front of a Redis server that a test can cut and restore, so one node
    loses Redis while the others keep it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def url(self, password: str | None = None) -> str:
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Stop accepting and drop every open connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


@pytest_asyncio.fixture
async def relay() -> AsyncIterator[Callable[[int], Awaitable[Relay]]]:
    relays: list[Relay] = []

    async def make(target_port: int) -> Relay:
        r = Relay(target_port)
        relays.append(r)
        await r.open()
        return r

    yield make
    for r in relays:
        await r.cut()
