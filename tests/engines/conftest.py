"""Real llama.cpp servers on loopback for tests (built once, cached outside the repo).

Fixtures (for any test under tests/engines/):
    llama_server_bin     session  Path of the cached llama-server (built on first use, ~5 min)
    tiny_gguf            session  Path of the cached tiny ChatML model, served as `tiny-llama`
    llama_fleet_factory  function callable(n=3, np=4, ctx=4096, extra_args=(), model=None)
                                  -> unstarted LlamaFleet, used as
                                  `async with llama_fleet_factory(n=2) as fleet:`
    llama_fleet          function a started 3-replica fleet (`fleet.urls`, `fleet.replicas`)
    http_session         function an aiohttp.ClientSession with a 60 s total timeout

Outside CI they skip with the reason when the machine cannot build llama.cpp or lacks the
`gguf`/`tokenizers` packages; under CI (env CI set) they fail instead, since CI must run them.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import aiohttp
import pytest

if TYPE_CHECKING:
    from loadtests.engines.llamacpp import LlamaFleet

FleetFactory = Callable[..., "LlamaFleet"]
SHARED_FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "engines"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"engine tests must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine_packages() -> None:
    """The model writer's packages are a test extra: say so instead of erroring on import."""
    missing = [name for name in ("gguf", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        _unavailable(f"missing Python packages {missing}: pip install gguf tokenizers")


@pytest.fixture(scope="session")
def llama_server_bin(engine_packages: None) -> Path:
    from loadtests.engines.llamacpp import build_prerequisites_missing, ensure_llama_server

    missing = build_prerequisites_missing()
    if missing:
        _unavailable(f"cannot build llama-server here: missing {', '.join(missing)}")
    return ensure_llama_server()


@pytest.fixture(scope="session")
def tiny_gguf(engine_packages: None) -> Path:
    from loadtests.engines.llamacpp import ensure_tiny_gguf

    return ensure_tiny_gguf()


@pytest.fixture
def llama_fleet_factory(llama_server_bin: Path, tiny_gguf: Path) -> FleetFactory:
    from loadtests.engines.llamacpp import LlamaFleet

    def make(
        n: int = 3,
        np: int = 4,
        ctx: int = 4096,
        extra_args: Sequence[str] = (),
        model: Path | None = None,
    ) -> LlamaFleet:
        return LlamaFleet(
            n, np, ctx, binary=llama_server_bin, model=model or tiny_gguf, extra_args=extra_args
        )

    return make


@pytest.fixture
async def llama_fleet(llama_fleet_factory: FleetFactory) -> AsyncIterator[LlamaFleet]:
    async with llama_fleet_factory() as fleet:
        yield fleet


@pytest.fixture
async def http_session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session
