"""oracle_hit_rate and true_hit_rate on hand-made simulator records."""

from __future__ import annotations

from typing import Any

import pytest

from loadtests.oracle import oracle_hit_rate, true_hit_rate


def record(t: float, prompt: int, cached: int, hashes: list[int], out: list[int] | None = None):
    row: dict[str, Any] = {
        "arrival_unix": t,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "block_hashes": hashes,
    }
    if out is not None:
        row["output_block_hashes"] = out
    return row


def test_oracle_counts_longest_earlier_prefix_across_replicas() -> None:
    records = [
        # replica B's record, listed first but arriving second: shares 2 blocks with the first
        record(2.0, 64, 0, [1, 2, 9, 10]),
        # replica A: the first request, nothing earlier; its answer completed block 4
        record(1.0, 50, 0, [1, 2, 3], out=[4]),
        # a later turn continuing the first request through its generated block
        record(3.0, 90, 0, [1, 2, 3, 4, 5]),
    ]
    # hits: 0 (first), 2 blocks (32 tokens), 4 blocks (64) -> 96 of 204 prompt tokens
    assert oracle_hit_rate(records, block_tokens=16) == pytest.approx(96 / 204)


def test_oracle_respects_the_last_token_limit() -> None:
    records = [record(1.0, 32, 0, [7, 8]), record(2.0, 32, 0, [7, 8])]
    # 32 tokens: at most (32 - 1) // 16 = 1 block may hit
    assert oracle_hit_rate(records, block_tokens=16) == pytest.approx(16 / 64)


def test_true_hit_rate_and_empty_inputs() -> None:
    records = [record(1.0, 100, 0, []), record(2.0, 100, 48, [])]
    assert true_hit_rate(records) == pytest.approx(0.24)
    assert true_hit_rate([]) == 0.0
    assert oracle_hit_rate([], block_tokens=16) == 0.0
