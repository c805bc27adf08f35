"""Wire format of cluster sync: compact, versioned, and strict about what it accepts.

A batch is one Redis stream entry with two fields: ``m``, a small orjson envelope (sender,
times, backend table, per-update hash counts, optional in-flight counts), and ``h``, every
update's block hashes back to back as little-endian uint64. Hashes are most of the volume,
so they cost 8 bytes each and no parsing. A snapshot is one little-endian float64 time
followed by packed hashes, oldest first.

Anything a peer (or a stranger with access to Redis) writes is checked before use: a bad
entry raises ``CodecError`` and is skipped and counted by the caller, never applied.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

VERSION = 1
MAX_NAME_CHARS = 2048
MAX_UPDATES = 65536
_BIG_ENDIAN = sys.byteorder == "big"
_TIME = struct.Struct("<d")


class CodecError(ValueError):
    """A stream entry or snapshot that is not ours, from a newer version, or corrupt."""


@dataclass(frozen=True, slots=True)
class Update:
    """``backend`` took the block chain ``hashes`` (root first) at ``ts`` (sender's clock)."""

    backend: str
    hashes: Sequence[int]
    ts: float


@dataclass(frozen=True, slots=True)
class Batch:
    node: str
    sent_at: float
    updates: list[Update]
    inflight: dict[str, int] | None = field(default=None)


def pack_hashes(hashes: Sequence[int]) -> bytes:
    """Raises ``OverflowError`` or ``TypeError`` for anything that is not a uint64."""
    a = array("Q", hashes)
    if _BIG_ENDIAN:
        a.byteswap()
    return a.tobytes()


def unpack_hashes(data: bytes) -> array:
    if len(data) % 8:
        raise CodecError(f"hash payload of {len(data)} bytes is not a multiple of 8")
    a = array("Q")
    a.frombytes(data)
    if _BIG_ENDIAN:
        a.byteswap()
    return a


def encode_batch(batch: Batch) -> tuple[dict[bytes, bytes], int]:
    """Stream entry fields for ``batch``, and how many updates were left out as invalid
    (hashes that are not uint64s, or a backend name peers would refuse)."""
    table: dict[str, int] = {}
    rows: list[list[Any]] = []
    parts: list[bytes] = []
    skipped = 0
    for u in batch.updates:
        try:
            packed = pack_hashes(u.hashes)
            _name(u.backend, "backend")
        except (OverflowError, TypeError, CodecError):
            skipped += 1
            continue
        i = table.setdefault(u.backend, len(table))
        rows.append([i, len(u.hashes), u.ts])
        parts.append(packed)
    env: dict[str, Any] = {
        "v": VERSION,
        "n": batch.node,
        "t": batch.sent_at,
        "b": list(table),
        "u": rows,
    }
    if batch.inflight is not None:
        env["i"] = batch.inflight
    return {b"m": orjson.dumps(env), b"h": b"".join(parts)}, skipped


def decode_batch(fields: Mapping[bytes, bytes]) -> Batch:
    try:
        env = orjson.loads(fields[b"m"])
        blob = fields.get(b"h", b"")
    except (KeyError, TypeError, orjson.JSONDecodeError) as e:
        raise CodecError(f"not a batch: {e}") from None
    if not isinstance(env, dict) or env.get("v") != VERSION:
        raise CodecError("unknown envelope version")
    node = _name(env.get("n"), "node")
    sent_at = _time(env.get("t"))
    backends = env.get("b")
    rows = env.get("u")
    if not isinstance(backends, list) or not isinstance(rows, list) or len(rows) > MAX_UPDATES:
        raise CodecError("backend table or update list missing or too long")
    names = [_name(b, "backend") for b in backends]
    hashes = unpack_hashes(blob)
    updates: list[Update] = []
    pos = 0
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            raise CodecError("update row is not [backend, count, time]")
        i, count = row[0], row[1]
        if not (_is_int(i) and 0 <= i < len(names) and _is_int(count) and count >= 0):
            raise CodecError("update row has a bad backend index or count")
        updates.append(Update(names[i], hashes[pos : pos + count].tolist(), _time(row[2])))
        pos += count
    if pos != len(hashes):
        raise CodecError(f"update counts add up to {pos} hashes, payload holds {len(hashes)}")
    return Batch(node, sent_at, updates, _inflight(env.get("i")))


def encode_snapshot(ts: float, hashes: Sequence[int]) -> bytes:
    """``hashes`` oldest first, as ``PrefixIndex.recent`` returns them."""
    return _TIME.pack(ts) + pack_hashes(hashes)


def decode_snapshot(data: bytes) -> tuple[float, array]:
    if not isinstance(data, bytes) or len(data) < _TIME.size:
        raise CodecError("snapshot too short")
    (ts,) = _TIME.unpack_from(data)
    return _time(ts), unpack_hashes(data[_TIME.size :])


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _name(v: object, what: str) -> str:
    if not isinstance(v, str) or not v or len(v) > MAX_NAME_CHARS:
        raise CodecError(f"bad {what} name")
    return v


def _time(v: object) -> float:
    if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)):
        raise CodecError("bad timestamp")
    return float(v)


def _inflight(v: object) -> dict[str, int] | None:
    if v is None:
        return None
    if not isinstance(v, dict) or len(v) > MAX_UPDATES:
        raise CodecError("in-flight counts are not a map")
    out: dict[str, int] = {}
    for k, n in v.items():
        if not (_is_int(n) and 0 <= n < 2**31):
            raise CodecError("bad in-flight count")
        out[_name(k, "backend")] = n
    return out
