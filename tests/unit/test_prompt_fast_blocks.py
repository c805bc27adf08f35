"""Block hashes reuse what they share with keys hashed shortly before (agents resend their
conversation each turn); the result is always the definition's, whatever came before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.prompt import block_hashes, blocks, salt_seed


def reference(text: str, block: int, cap: int, salt: str | None = None) -> list[int]:
    """The definition, written the slow obvious way."""
    data = text[: block * cap].encode("utf-8", "surrogatepass")
    seed, out = salt_seed(salt), []
    for i in range(min(len(data) // block, cap)):
        seed = xxhash.xxh3_64_intdigest(data[i * block : (i + 1) * block], seed=seed)
        out.append(seed)
    return out


@contextmanager
def fresh_memory(limit: int) -> Iterator[blocks._RecentKeys]:
    """An empty memory of recent keys for the duration (small ones fill up in tests)."""
    recent = blocks._RecentKeys(limit)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks, "_recent", recent)
        yield recent


STEP = st.tuples(
    st.sampled_from(["extend", "cut and extend", "new", "repeat"]),
    st.text(st.sampled_from("abcé\n 🙂\ud83d"), max_size=120),
    st.integers(0, 400),
    st.sampled_from([None, "tenant-a"]),
    st.sampled_from([4, 16]),
    st.sampled_from([50, 3]),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(STEP, min_size=1, max_size=12))
def test_hashes_are_the_definition_after_any_history(steps) -> None:
    """Keys that extend, fork from, repeat or have nothing to do with earlier ones, under
    different salts, block sizes and caps, with a memory small enough to forget."""
    previous = ""
    with fresh_memory(4096) as memory:
        for kind, piece, cut, salt, block, cap in steps:
            if kind == "extend":
                text = previous + piece
            elif kind == "cut and extend":
                text = previous[:cut] + piece
            elif kind == "new":
                text = piece * 3
            else:
                text = previous
            assert block_hashes(text, block, cap, salt) == reference(text, block, cap, salt)
            assert memory.size <= memory.limit
            previous = text


def test_a_growing_conversation_keeps_one_key_in_memory() -> None:
    """Each turn's key replaces the one it extends."""
    turn = "system prompt and tools. " * 40
    with fresh_memory(1 << 20) as memory:
        for i in range(5):
            turn += f"turn {i}: a question and its answer. " * 10
            assert block_hashes(turn, 16, 8192) == reference(turn, 16, 8192)
        assert [len(entries) for entries in memory._by_start.values()] == [1]


def test_callers_own_their_lists() -> None:
    text = "the same key, twice. " * 20
    with fresh_memory(4096):
        first = block_hashes(text, 8, 8192)
        first.clear()
        assert block_hashes(text, 8, 8192) == reference(text, 8, 8192)


def test_least_recently_used_starts_are_forgotten_first() -> None:
    keys = [f"conversation {i} " * 10 for i in range(6)]
    with fresh_memory(1 << 20) as memory:
        for key in keys:
            block_hashes(key, 16, 8192)
        room = memory.size  # exactly the six keys
    with fresh_memory(room) as memory:
        for key in keys:
            block_hashes(key, 16, 8192)
        block_hashes(keys[0], 16, 8192)  # used again: now the most recent
        block_hashes("conversation 9 " * 10, 16, 8192)  # as big: one has to go
        assert memory.size <= memory.limit
        remembered = [old for entries in memory._by_start.values() for _, old, _ in entries]
    assert any(old.startswith(b"conversation 0 ") for old in remembered)
    assert not any(old.startswith(b"conversation 1 ") for old in remembered)
    assert any(old.startswith(b"conversation 2 ") for old in remembered)


def test_text_that_extends_a_remembered_key_gives_the_same_hashes() -> None:
    """Only its new end is encoded: multi-byte characters across the seam included."""
    turn = "system 🙂 prompt, tools. " * 20
    with fresh_memory(1 << 20):
        for i in range(6):
            turn += "é" * i + f"turn {i} 🙂 answer\ud83d. " * 7
            assert block_hashes(turn, 16, 8192) == reference(turn, 16, 8192)
