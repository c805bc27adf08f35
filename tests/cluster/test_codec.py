"""Wire format and snapshot merging: round trips, and garbage never gets past the decoder."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.cluster.codec import (
    Batch,
    CodecError,
    Update,
    decode_batch,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
)
from proxy.cluster.merge import merge_recent

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@given(
    st.lists(
        st.tuples(st.sampled_from(["http://a:1", "http://b:2", "http://c:3"]), st.lists(U64)),
        max_size=20,
    )
)
@settings(max_examples=50, deadline=None)
def test_batch_round_trip(items: list[tuple[str, list[int]]]) -> None:
    updates = [Update(b, h, 1000.0 + i) for i, (b, h) in enumerate(items)]
    fields, skipped = encode_batch(Batch("node-1", 2000.5, updates, {"http://a:1": 3}))
    assert skipped == 0
    got = decode_batch(fields)
    assert got.node == "node-1"
    assert got.sent_at == 2000.5
    assert got.inflight == {"http://a:1": 3}
    assert [(u.backend, list(u.hashes), u.ts) for u in got.updates] == [
        (u.backend, u.hashes, u.ts) for u in updates
    ]


def test_hashes_cost_eight_bytes_each() -> None:
    fields, _ = encode_batch(Batch("n", 1.0, [Update("http://a", list(range(1000)), 1.0)]))
    assert len(fields[b"h"]) == 8000
    assert len(fields[b"m"]) < 100


def test_invalid_updates_are_left_out_and_counted() -> None:
    updates = [
        Update("http://a", [1, 2], 1.0),
        Update("http://a", [-1], 1.0),
        Update("http://a", [2**64], 1.0),
        Update("http://a", ["x"], 1.0),  # type: ignore[list-item]
        Update("", [3], 1.0),
        Update("http://b", [4], 1.0),
    ]
    fields, skipped = encode_batch(Batch("n", 1.0, updates))
    assert skipped == 4
    got = decode_batch(fields)
    assert [(u.backend, list(u.hashes)) for u in got.updates] == [
        ("http://a", [1, 2]),
        ("http://b", [4]),
    ]
    assert got.inflight is None


def _envelope(**changes: object) -> dict[bytes, bytes]:
    env: dict[str, object] = {"v": 1, "n": "n", "t": 1.0, "b": ["http://a"], "u": [[0, 1, 1.0]]}
    env.update(changes)
    return {b"m": orjson.dumps(env), b"h": (7).to_bytes(8, "little")}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {b"m": b"not json"},
        {b"m": b"[]"},
        _envelope(v=2),
        _envelope(n=""),
        _envelope(n=5),
        _envelope(t="soon"),
        _envelope(t=True),
        _envelope(b="http://a"),
        _envelope(b=[7]),
        _envelope(u=[[1, 1, 1.0]]),
        _envelope(u=[[0, 2, 1.0]]),
        _envelope(u=[[0, -1, 1.0]]),
        _envelope(u=[[0, 1]]),
        _envelope(u=[[0, 1, None]]),
        _envelope(u=[]),
        _envelope(i=[1]),
        _envelope(i={"http://a": -1}),
        _envelope(i={"http://a": "3"}),
        {b"m": orjson.dumps({"v": 1, "n": "n", "t": 1.0, "b": [], "u": []}), b"h": b"abc"},
    ],
)
def test_bad_entries_raise_codec_error(fields: dict[bytes, bytes]) -> None:
    with pytest.raises(CodecError):
        decode_batch(fields)


@given(st.dictionaries(st.binary(max_size=3), st.binary(max_size=64), max_size=3))
@settings(max_examples=200, deadline=None)
def test_garbage_only_ever_raises_codec_error(fields: dict[bytes, bytes]) -> None:
    try:
        batch = decode_batch(fields)
    except CodecError:
        return
    assert all(u.backend for u in batch.updates)


@given(st.binary(max_size=64))
@settings(max_examples=100, deadline=None)
def test_garbage_snapshot_only_ever_raises_codec_error(data: bytes) -> None:
    try:
        _, hashes = decode_snapshot(data)
    except CodecError:
        return
    assert len(data) == 8 + 8 * len(hashes)


def test_snapshot_round_trip() -> None:
    ts, hashes = decode_snapshot(encode_snapshot(123.25, [5, 2**64 - 1, 0]))
    assert ts == 123.25
    assert list(hashes) == [5, 2**64 - 1, 0]


def test_merge_interleaves_by_recency_and_dedupes() -> None:
    fresh = [1, 2, 3]  # oldest first: 3 is the newest
    older = [10, 3, 20]
    assert merge_recent([fresh, older], limit=100) == [10, 1, 2, 20, 3]
    assert merge_recent([fresh, older], limit=3) == [2, 20, 3]
    assert merge_recent([], limit=5) == []
