"""Chained block hashes of a routing key: equal hashes mean equal prefixes.

The text is encoded to UTF-8 once (lone surrogates passed through) and cut into blocks of
``block_chars`` bytes: blocks are byte blocks, so ``block_chars`` counts bytes, which for
ASCII-heavy prompts (~4 bytes a token) is also characters. Only full blocks are hashed (a
partial tail would change as the conversation grows), at most ``max_blocks`` of them.

Block i's hash is ``xxh3_64(block_i, seed=hash_{i-1})``, so it depends on every byte before
it; the first block's seed is 0, or the hash of a tenant salt so that tenants never share
keys. This runs on every request: the blocks are cut by one ``struct`` call per 64 blocks
and hashed in a list comprehension, about one C call per block (~0.1 us).

Agents resend their whole conversation every turn, so most keys extend, or share a long
start with, a key hashed shortly before. The latest keys are remembered (up to
``REMEMBERED_BYTES`` of them, a few per first block); the blocks a new key shares with one
of them are found by comparing bytes (memcmp, ~50x faster than hashing them) and their
hashes reused. The result is the same list either way.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from functools import cache

import xxhash

_CHUNK = 64  # blocks cut per struct call
REMEMBERED_BYTES = 32 << 20
_PER_START = 4  # keys remembered per (block size, seed, first block)

_hash = xxhash.xxh3_64_intdigest


@cache
def _cutter(block_chars: int, count: int) -> struct.Struct:
    return struct.Struct(f"{block_chars}s" * count)


def salt_seed(salt: bytes | str | None) -> int:
    """The first block's seed for a tenant salt (0 without one; an empty salt is none)."""
    if not salt:
        return 0
    return _hash(salt.encode("utf-8", "surrogatepass") if isinstance(salt, str) else salt)


def block_hashes(
    text: str, block_chars: int, max_blocks: int, salt: bytes | str | None = None
) -> list[int]:
    """The chained xxh3_64 hashes of the full ``block_chars``-byte blocks of ``text``."""
    cap = block_chars * max_blocks
    data = text[:cap].encode("utf-8", "surrogatepass")
    count = min(len(data) // block_chars, max_blocks)
    if not count:
        return []
    seed = salt_seed(salt)
    first = _hash(memoryview(data)[:block_chars], seed)
    start = (block_chars, seed, first)
    size = count * block_chars
    hashes = _recent.shared(start, data, size) or [first]
    if len(hashes) < count:
        hashes.extend(_chain(data, block_chars, len(hashes), count, hashes[-1]))
        _recent.remember(start, data, size, hashes)
    return hashes


def _chain(data: bytes, block_chars: int, first: int, count: int, prev: int) -> list[int]:
    """The hashes of blocks ``first`` to ``count`` - 1, chained on from ``prev``."""
    blocks: list[bytes] = []
    offset = first * block_chars
    chunks, rest = divmod(count - first, _CHUNK)
    cut = _cutter(block_chars, _CHUNK)
    for _ in range(chunks):
        blocks.extend(cut.unpack_from(data, offset))
        offset += _CHUNK * block_chars
    if rest:
        blocks.extend(_cutter(block_chars, rest).unpack_from(data, offset))
    return [prev := _hash(block, prev) for block in blocks]


def _shared_blocks(data: bytes, size: int, old: memoryview, block_chars: int) -> int:
    """How many leading blocks of ``data[:size]`` equal those of ``old`` (whole blocks),
    compared with memcmp (``bytes.startswith``)."""
    limit = min(size, len(old)) // block_chars
    if data.startswith(old[: limit * block_chars]):
        return limit
    same, differ = 0, limit  # blocks known equal / a count known to include a difference
    while differ - same > 1:
        mid = (same + differ) // 2
        if data.startswith(old[same * block_chars : mid * block_chars], same * block_chars):
            same = mid
        else:
            differ = mid
    return same


Start = tuple[int, int, int]  # block size, seed, first block's hash


class _RecentKeys:
    """The latest keys hashed (their bytes and hashes), newest first under each start; the
    least recently used starts are forgotten beyond ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._by_start: OrderedDict[Start, list[tuple[memoryview, tuple[int, ...]]]]
        self._by_start = OrderedDict()

    def shared(self, start: Start, data: bytes, size: int) -> list[int]:
        """The hashes of the longest run of leading blocks ``data[:size]`` shares with a
        key remembered under ``start`` (a new list)."""
        entries = self._by_start.get(start)
        if not entries:
            return []
        self._by_start.move_to_end(start)
        best: tuple[int, ...] = ()
        best_count = 0
        for old, hashes in entries:
            count = _shared_blocks(data, size, old, start[0])
            if count > best_count:
                best, best_count = hashes, count
        return list(best[:best_count])

    def remember(self, start: Start, data: bytes, size: int, hashes: list[int]) -> None:
        """Keep a key just hashed, in place of the ones it extends."""
        if size > self.limit:
            return
        view = memoryview(data if len(data) - size < start[0] else data[:size])[:size]
        entries = [(view, tuple(hashes))]
        for old, old_hashes in self._by_start.pop(start, ()):
            extended = len(old) <= size and data.startswith(old)
            if len(entries) < _PER_START and not extended:
                entries.append((old, old_hashes))
            else:
                self.size -= len(old)
        self._by_start[start] = entries
        self.size += size
        while self.size > self.limit:
            _, dropped = self._by_start.popitem(last=False)
            self.size -= sum(len(old) for old, _ in dropped)


_recent = _RecentKeys(REMEMBERED_BYTES)
