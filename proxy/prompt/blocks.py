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
of them are found by comparing (memcmp, ~50x faster than hashing them) and their hashes
reused, and a key that extends a remembered one only has its new end encoded. The result
is the same list either way. The memory is for one thread (the proxy's event loop).
"""

from __future__ import annotations

import struct
import sys
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


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def block_hashes(
    text: str, block_chars: int, max_blocks: int, salt: bytes | str | None = None
) -> list[int]:
    """The chained xxh3_64 hashes of the full ``block_chars``-byte blocks of ``text``."""
    text = text[: block_chars * max_blocks]
    head = _utf8(text[:block_chars])
    if len(head) < block_chars:
        return []
    seed = salt_seed(salt)
    first = _hash(head[:block_chars], seed)
    start = (block_chars, seed, first)
    data, hashes = _recent.recall(start, text)
    count = min(len(data) // block_chars, max_blocks)
    del hashes[count:]
    if not hashes:
        hashes.append(first)
    if len(hashes) < count:
        hashes.extend(_chain(data, block_chars, len(hashes), count, hashes[-1]))
        _recent.remember(start, text, data, hashes)
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


def _shared_blocks(data: bytes, old: bytes, block_chars: int) -> int:
    """How many leading whole blocks two encoded keys have in common (memcmp, through
    ``bytes.startswith``)."""
    limit = min(len(data), len(old)) // block_chars
    view = memoryview(old)
    if data.startswith(view[: limit * block_chars]):
        return limit
    same, differ = 0, limit  # blocks known equal / a count known to include a difference
    while differ - same > 1:
        mid = (same + differ) // 2
        if data.startswith(view[same * block_chars : mid * block_chars], same * block_chars):
            same = mid
        else:
            differ = mid
    return same


Start = tuple[int, int, int]  # block size, seed, first block's hash
Key = tuple[str, bytes, tuple[int, ...]]  # a key's text, its UTF-8 bytes, its hashes


class _RecentKeys:
    """The latest keys hashed, newest first under each start; the least recently used
    starts are forgotten beyond ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._by_start: OrderedDict[Start, list[Key]] = OrderedDict()

    def recall(self, start: Start, text: str) -> tuple[bytes, list[int]]:
        """``text`` encoded, and the hashes of the leading blocks it shares with a key
        remembered under ``start`` (a new list). Text that extends a remembered key's
        text (an agent's next turn) is compared as text and only its new end encoded:
        encoding costs ~1.4 ns a character once a text holds a character outside Latin-1,
        comparing a fraction of that."""
        entries = self._by_start.get(start)
        if not entries:
            return _utf8(text), []
        self._by_start.move_to_end(start)
        extended: Key | None = None
        for entry in entries:
            old = entry[0]
            if text.startswith(old) and (extended is None or len(old) > len(extended[0])):
                extended = entry
        if extended is not None:
            old_text, old_data, old_hashes = extended
            tail = text[len(old_text) :]
            return (old_data + _utf8(tail) if tail else old_data), list(old_hashes)
        data = _utf8(text)
        best: tuple[int, ...] = ()
        best_count = 0
        for _, old_data, old_hashes in entries:
            count = min(_shared_blocks(data, old_data, start[0]), len(old_hashes))
            if count > best_count:
                best, best_count = old_hashes, count
        return data, list(best[:best_count])

    def remember(self, start: Start, text: str, data: bytes, hashes: list[int]) -> None:
        """Keep a key just hashed, in place of the ones it extends."""
        key = (text, data, tuple(hashes))
        size = _footprint(key)
        if size > self.limit:
            return
        entries = [key]
        for entry in self._by_start.pop(start, ()):
            if len(entries) < _PER_START and not text.startswith(entry[0]):
                entries.append(entry)
            else:
                self.size -= _footprint(entry)
        self._by_start[start] = entries
        self.size += size
        while self.size > self.limit:
            _, dropped = self._by_start.popitem(last=False)
            self.size -= sum(_footprint(entry) for entry in dropped)


def _footprint(key: Key) -> int:
    """Bytes a remembered key holds (a 64-bit hash is a 36-byte int object)."""
    text, data, hashes = key
    return sys.getsizeof(text) + sys.getsizeof(data) + sys.getsizeof(hashes) + 36 * len(hashes)


_recent = _RecentKeys(REMEMBERED_BYTES)
