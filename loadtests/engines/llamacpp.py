"""llama.cpp's `llama-server`, built once from the pinned PyPI sdist, and fleets of it.

CLI:
    python -m loadtests.engines.llamacpp build            # build (or find) the binary
    python -m loadtests.engines.llamacpp model OUT.gguf   # write the tiny test model
    python -m loadtests.engines.llamacpp serve -n 3       # run a fleet until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from loadtests.engines.cache import cache_root, file_lock
from loadtests.engines.fleet import Fleet, serve_until_stopped
from loadtests.engines.replica import HOST
from loadtests.engines.tiny_gguf import MODEL_NAME, write_tiny_gguf

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TINY_GGUF_NAME = "tiny-llama-v1.gguf"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_CCACHE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


class BuildError(RuntimeError):
    """Building llama-server failed; the message carries the build log's tail."""


def engine_dir() -> Path:
    """Cache folder for this pinned llama.cpp: binary, build log and tiny model."""
    return cache_root() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}"


def build_prerequisites_missing() -> list[str]:
    """Tools the build needs that this machine lacks (empty when a build can be tried)."""
    return [tool for tool in ("cmake", "c++", "cc") if shutil.which(tool) is None]


def ensure_llama_server() -> Path:
    """The cached `llama-server` binary, building it first if needed (minutes, once)."""
    binary = engine_dir() / "llama-server"
    if binary.exists():
        return binary
    with file_lock(engine_dir() / "build.lock"):
        if not binary.exists():
            _build(binary)
    return binary


def ensure_tiny_gguf() -> Path:
    """The cached tiny test model (written on first use, under a second)."""
    model = engine_dir() / TINY_GGUF_NAME
    if not model.exists():
        with file_lock(engine_dir() / "model.lock"):
            if not model.exists():
                write_tiny_gguf(model)
    return model


def _run_logged(argv: Sequence[str], log_path: Path, cwd: Path) -> None:
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        result = subprocess.run(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise BuildError(f"{argv[0]} exited with {result.returncode} (log {log_path}):\n{tail}")


def _build(binary: Path) -> None:
    """Download the sdist, build only the server target on the vendored llama.cpp, cache it."""
    missing = build_prerequisites_missing()
    if missing:
        raise BuildError(f"cannot build llama-server: missing {', '.join(missing)}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    log_path = binary.parent / "build.log"
    log_path.write_bytes(b"")
    with tempfile.TemporaryDirectory(dir=binary.parent, prefix="build-") as tmp:
        work = Path(tmp)
        _run_logged(
            [
                sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(work),
            ],
            log_path,
            work,
        )  # fmt: skip
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        source = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
        build = work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run_logged(
            ["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_FLAGS], log_path, work
        )
        _run_logged(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", "2"], log_path, work
        )
        staged = binary.with_name(binary.name + ".tmp")
        shutil.copy2(build / "bin" / "llama-server", staged)
        staged.replace(binary)


class LlamaFleet(Fleet):
    """`n` llama-server replicas, each with `np` slots sharing a `ctx`-token KV cache.

    Every replica serves the tiny model (unless `model` is given) under the id `tiny-llama`,
    with /metrics and /slots enabled and one compute thread.
    """

    name = "llama"

    def __init__(
        self,
        n: int = 3,
        np: int = 4,
        ctx: int = 4096,
        *,
        binary: Path | None = None,
        model: Path | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
    ) -> None:
        super().__init__(n, startup_timeout)
        self.np = np
        self.ctx = ctx
        self.binary = binary
        self.model = model
        self.extra_args = tuple(extra_args)

    async def prepare(self) -> None:
        if self.binary is None:
            self.binary = await asyncio.to_thread(ensure_llama_server)
        if self.model is None:
            self.model = await asyncio.to_thread(ensure_tiny_gguf)

    def argv(self, port: int) -> list[str]:
        return [
            str(self.binary), "-m", str(self.model), "--alias", MODEL_NAME,
            "-np", str(self.np), "-c", str(self.ctx), "-t", "1",
            "--metrics", "--slots", "--host", HOST, "--port", str(port),
            *self.extra_args,
        ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtests.engines.llamacpp")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build (or find) the cached llama-server binary")
    model = commands.add_parser("model", help="write the tiny GGUF test model")
    model.add_argument("out", type=Path)
    serve = commands.add_parser("serve", help="run a fleet on loopback until interrupted")
    serve.add_argument("-n", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "build":
        started = time.monotonic()
        binary = ensure_llama_server()
        print(f"{binary} ({time.monotonic() - started:.1f}s)")
    elif args.command == "model":
        print(write_tiny_gguf(args.out))
    else:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_until_stopped(LlamaFleet(args.n)))


if __name__ == "__main__":
    main()
