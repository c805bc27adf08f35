"""Where built engines and tiny models are kept between runs: outside the repo, shared safely."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    """`$PREFIX_PROXY_CACHE`, else ~/.cache/prefix-proxy."""
    override = os.environ.get("PREFIX_PROXY_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "prefix-proxy"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` so two processes never build the same thing at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
