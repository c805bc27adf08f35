"""Chained block hashes: full byte blocks only, a cap, tenant salts, and the chaining
properties routing relies on (equal prefixes <=> equal leading hashes)."""

from __future__ import annotations

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.prompt import block_hashes, salt_seed


def reference(data: bytes, block: int, cap: int, seed: int = 0) -> list[int]:
    """The definition, written the slow obvious way."""
    out = []
    for i in range(min(len(data) // block, cap)):
        seed = xxhash.xxh3_64_intdigest(data[i * block : (i + 1) * block], seed=seed)
        out.append(seed)
    return out


def test_matches_the_definition_across_chunk_boundaries() -> None:
    text = "".join(f"message {i}: the quick brown fox. " for i in range(2000))
    for count in (0, 1, 63, 64, 65, 129, 500):
        part = text[: count * 16 + 7]
        assert block_hashes(part, 16, 8192) == reference(part.encode(), 16, 8192)


def test_only_full_blocks_are_hashed() -> None:
    assert block_hashes("x" * 127, 128, 8192) == []
    assert len(block_hashes("x" * 128, 128, 8192)) == 1
    assert len(block_hashes("x" * 383, 128, 8192)) == 2


def test_blocks_are_utf8_bytes_not_characters() -> None:
    text = "é" * 64  # 64 characters, 128 bytes
    assert block_hashes(text, 128, 8192) == reference(text.encode(), 128, 8192)
    assert len(block_hashes(text, 128, 8192)) == 1


def test_cap_limits_the_number_of_blocks() -> None:
    text = "abcd" * 10_000
    hashes = block_hashes(text, 8, 100)
    assert len(hashes) == 100
    assert hashes == block_hashes(text, 8, 8192)[:100]


def test_lone_surrogates_hash_instead_of_failing() -> None:
    text = "a\ud800b" * 50
    assert len(block_hashes(text, 16, 8192)) == len(text.encode("utf-8", "surrogatepass")) // 16


def test_salt_changes_every_hash_and_is_deterministic() -> None:
    text = "system prompt shared by every tenant " * 20
    plain = block_hashes(text, 32, 8192)
    tenant_a = block_hashes(text, 32, 8192, salt="tenant-a")
    tenant_b = block_hashes(text, 32, 8192, salt=b"tenant-b")
    assert tenant_a == block_hashes(text, 32, 8192, salt=b"tenant-a")
    assert not set(plain) & set(tenant_a)
    assert not set(tenant_a) & set(tenant_b)
    assert block_hashes(text, 32, 8192, salt="") == plain
    assert salt_seed(None) == 0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300), st.text(max_size=300), st.integers(1, 40))
def test_equal_prefixes_give_equal_leading_hashes(shared: str, a: str, b: str, block: int):
    ha = block_hashes(shared + a, block, 8192)
    hb = block_hashes(shared + b, block, 8192)
    full = len(shared.encode("utf-8", "surrogatepass")) // block
    assert ha[:full] == hb[:full]
    assert ha[:full] == block_hashes(shared, block, 8192)


@settings(max_examples=200, deadline=None)
@given(
    st.text(st.characters(max_codepoint=127), min_size=1, max_size=400),
    st.integers(1, 40),
    st.data(),
)
def test_a_different_earlier_byte_changes_every_later_hash(text: str, block: int, data) -> None:
    position = data.draw(st.integers(0, len(text) - 1))
    changed = text[:position] + chr((ord(text[position]) + 1) % 128) + text[position + 1 :]
    before = block_hashes(text, block, 8192)
    after = block_hashes(changed, block, 8192)
    assert len(before) == len(after)
    assert before[: position // block] == after[: position // block]
    for i in range(position // block, len(before)):
        assert before[i] != after[i]
