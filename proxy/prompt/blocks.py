"""Chained block hashes of a routing key: equal hashes mean equal prefixes.

The text is encoded to UTF-8 once (lone surrogates passed through) and cut into blocks of
``block_chars`` bytes: blocks are byte blocks, so ``block_chars`` counts bytes, which for
ASCII-heavy prompts (~4 bytes a token) is also characters. Only full blocks are hashed (a
partial tail would change as the conversation grows), at most ``max_blocks`` of them.

Block i's hash is ``xxh3_64(block_i, seed=hash_{i-1})``, so it depends on every byte before
it; the first block's seed is 0, or the hash of a tenant salt so that tenants never share
keys. This runs on every request: the blocks are cut by one ``struct`` call per 64 blocks
and hashed in a list comprehension, about one C call per block.
"""

from __future__ import annotations

import struct
from functools import cache

import xxhash

_CHUNK = 64  # blocks cut per struct call

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
    chunks, rest = divmod(count, _CHUNK)
    cut = _cutter(block_chars, _CHUNK)
    blocks: list[bytes] = []
    for offset in range(0, chunks * _CHUNK * block_chars, _CHUNK * block_chars):
        blocks.extend(cut.unpack_from(data, offset))
    if rest:
        blocks.extend(_cutter(block_chars, rest).unpack_from(data, chunks * _CHUNK * block_chars))
    prev = salt_seed(salt)
    return [prev := _hash(block, prev) for block in blocks]
