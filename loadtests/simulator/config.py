"""Simulator settings: engine shape, timing model and fault knobs, from flags or JSON."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from loadtests.simulator.prompt import ChatRenderer

DIALECTS = ("vllm", "sglang", "llamacpp")


@dataclass(slots=True)
class Faults:
    """Misbehaviour on demand, for tests; changed at run time through POST /sim/config.

    fail_next: the next K generation requests answer ``fail_status``.
    hang: generation requests are accepted and never answered.
    chunk_delay_s: extra delay before every streamed chunk.
    die_after_chunks: close the connection after this many streamed chunks (a non-streamed
        request is dropped without an answer).
    metrics_garbage / metrics_delay_s: /metrics answers junk / answers late.
    health_status: the status code of GET /health.
    """

    fail_next: int = 0
    fail_status: int = 500
    hang: bool = False
    chunk_delay_s: float = 0.0
    die_after_chunks: int | None = None
    metrics_garbage: bool = False
    metrics_delay_s: float = 0.0
    health_status: int = 200

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply a partial JSON update; raise ValueError naming the first bad key."""
        known = {f.name: f for f in dataclasses.fields(self)}
        checked: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in known:
                raise ValueError(f"unknown fault knob {key!r}; known: {sorted(known)}")
            checked[key] = _check_knob(key, value)
        for key, value in checked.items():
            setattr(self, key, value)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_knob(key: str, value: Any) -> Any:
    if key in ("hang", "metrics_garbage"):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        return value
    if key == "die_after_chunks" and value is None:
        return None
    if key in ("chunk_delay_s", "metrics_delay_s"):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600:
            raise ValueError(f"{key} must be a number of seconds in [0, 3600]")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer")
    if key in ("fail_status", "health_status") and not 100 <= value <= 599:
        raise ValueError(f"{key} must be an HTTP status code")
    return value


@dataclass(slots=True)
class SimConfig:
    """One simulated replica. Times are model milliseconds, divided by ``speedup``."""

    port: int
    host: str = "127.0.0.1"
    dialect: str = "vllm"
    model: str = "sim-model"
    chat_template: str | None = None
    block_tokens: int = 16
    capacity_tokens: int = 65536
    max_running: int = 16
    max_model_len: int = 32768
    default_max_tokens: int = 16
    prefill_ms_per_1k_tokens: float = 40.0
    decode_ms_per_token: float = 8.0
    decode_ms_per_seq: float = 0.25
    speedup: float = 1.0
    cache_generated: bool = True
    max_records: int = 100_000
    faults: Faults = field(default_factory=Faults)


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    """Build a SimConfig from command-line flags; argparse exits with a message on bad input."""
    d = SimConfig(port=0)
    f = Faults()
    p = argparse.ArgumentParser(prog="python -m loadtests.simulator", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default=d.host)
    p.add_argument("--dialect", choices=DIALECTS, default=d.dialect)
    p.add_argument("--model", default=d.model, help="served model name")
    p.add_argument("--chat-template", help="Jinja2 chat template file (default: ChatML)")
    p.add_argument(
        "--block-tokens", type=_positive_int, default=d.block_tokens, help="tokens per cache block"
    )
    p.add_argument(
        "--capacity-tokens",
        type=_positive_int,
        default=d.capacity_tokens,
        help="KV cache size; the prefix cache evicts LRU blocks beyond it",
    )
    p.add_argument(
        "--max-running",
        type=_positive_int,
        default=d.max_running,
        help="batch size limit; more requests wait in a FIFO queue (llama.cpp: slots)",
    )
    p.add_argument("--max-model-len", type=_positive_int, default=d.max_model_len)
    p.add_argument("--default-max-tokens", type=_positive_int, default=d.default_max_tokens)
    p.add_argument(
        "--prefill-ms-per-1k-tokens", type=_non_negative, default=d.prefill_ms_per_1k_tokens
    )
    p.add_argument("--decode-ms-per-token", type=_non_negative, default=d.decode_ms_per_token)
    p.add_argument("--decode-ms-per-seq", type=_non_negative, default=d.decode_ms_per_seq)
    p.add_argument(
        "--speedup", type=_positive_float, default=d.speedup, help="divides every model time"
    )
    p.add_argument(
        "--no-cache-generated",
        dest="cache_generated",
        action="store_false",
        help="keep only prompt blocks, not generated ones, in the prefix cache",
    )
    p.add_argument("--max-records", type=_positive_int, default=d.max_records)
    p.add_argument(
        "--fail-next", type=int, default=f.fail_next, help="fail the next K generation requests"
    )
    p.add_argument("--fail-status", type=int, default=f.fail_status)
    p.add_argument("--hang", action="store_true", help="accept requests, never answer")
    p.add_argument("--chunk-delay-s", type=_non_negative, default=f.chunk_delay_s)
    p.add_argument(
        "--die-after-chunks", type=int, default=None, help="drop the connection after K chunks"
    )
    p.add_argument("--metrics-garbage", action="store_true")
    p.add_argument("--metrics-delay-s", type=_non_negative, default=f.metrics_delay_s)
    p.add_argument("--health-status", type=int, default=f.health_status)
    a = p.parse_args(argv)
    faults = Faults()
    try:
        faults.update(
            {
                "fail_next": a.fail_next,
                "fail_status": a.fail_status,
                "hang": a.hang,
                "chunk_delay_s": a.chunk_delay_s,
                "die_after_chunks": a.die_after_chunks,
                "metrics_garbage": a.metrics_garbage,
                "metrics_delay_s": a.metrics_delay_s,
                "health_status": a.health_status,
            }
        )
    except ValueError as e:
        p.error(str(e))
    if a.capacity_tokens < a.block_tokens:
        p.error("--capacity-tokens must hold at least one block")
    if a.chat_template is not None:
        try:
            ChatRenderer.from_file(a.chat_template)
        except (OSError, UnicodeDecodeError, TemplateError) as e:
            p.error(f"--chat-template {a.chat_template}: {e}")
    return SimConfig(
        port=a.port,
        host=a.host,
        dialect=a.dialect,
        model=a.model,
        chat_template=a.chat_template,
        block_tokens=a.block_tokens,
        capacity_tokens=a.capacity_tokens,
        max_running=a.max_running,
        max_model_len=a.max_model_len,
        default_max_tokens=a.default_max_tokens,
        prefill_ms_per_1k_tokens=a.prefill_ms_per_1k_tokens,
        decode_ms_per_token=a.decode_ms_per_token,
        decode_ms_per_seq=a.decode_ms_per_seq,
        speedup=a.speedup,
        cache_generated=a.cache_generated,
        max_records=a.max_records,
        faults=faults,
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError("must be a non-negative number")
    return value
