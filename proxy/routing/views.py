"""The data the pure routing core reads and returns: no I/O, no clocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.backends.load import LoadSnapshot


@dataclass(frozen=True, slots=True)
class BackendView:
    """A read-only picture of one backend at decision time."""

    id: str
    healthy: bool
    draining: bool
    circuit_open: bool
    models: frozenset[str]
    inflight: int
    load: LoadSnapshot | None
    load_stale: bool
    inflight_at_scrape: int = 0


@dataclass(frozen=True, slots=True)
class RequestView:
    """What routing needs to know about one request.

    ``block_hashes`` are the chained hashes of the rendered prompt's full blocks;
    ``block_tokens`` is the estimated number of engine tokens per block.
    """

    model: str
    block_hashes: Sequence[int]
    block_tokens: float
    prompt_tokens: int
    session_key: str | None
    seq: int
    now: float


@dataclass(slots=True)
class Decision:
    """The ranked backends (best first, for retries) and why."""

    ranked: list[str]
    reason: str
    matched_blocks: dict[str, int] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
