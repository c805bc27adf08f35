"""Benchmark charts from a small hand-made rows file: valid PNGs, clear errors on garbage."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (the charts extra)")

from loadtests.charts import ChartInputError, check_results, slug, write_charts

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SKEWED = "skewed (70% one system prompt)"


def row(name: str, hit: float, rng: random.Random, timed: bool = True) -> dict:
    r = {
        "name": name,
        "requests": 40,
        "errors": 0,
        "hit_rate": hit,
        "oracle": 0.88,
        "ttft_p50_ms": 150.0,
        "ttft_p99_ms": 900.0,
        "per_replica": [14, 13, 13],
        "of_oracle": hit / 0.88,
    }
    if timed:
        r["ttfts_ms"] = [rng.lognormvariate(5, 0.8) for _ in range(40)]
        r["replica_arrivals_s"] = [
            sorted(rng.uniform(0, 12) for _ in range(n)) for n in (14, 13, 13)
        ]
    return r


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    rng = random.Random(7)
    doc = {
        "balanced": [
            row("prefix-proxy round-robin", 0.66, rng),
            row("prefix-proxy default", 0.85, rng),
        ],
        SKEWED: [
            row("prefix-proxy default", 0.86, rng),
            row("sglang-router cache_aware", 0.0, rng, timed=False) | {"oracle": 0.0, "errors": 40},
        ],
    }
    path = tmp_path / "bench_routing.json"
    path.write_text(json.dumps(doc))
    return path


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_command_writes_every_chart_as_a_png(rows_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "charts"
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.charts", str(rows_file), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    expected = {
        "hit_rate.png",
        "ttft_cdf.png",
        "replica_load_balanced.png",
        f"replica_load_{slug(SKEWED)}.png",
    }
    assert {p.name for p in out.iterdir()} == expected
    assert {Path(line).name for line in done.stdout.split()} == expected
    for name in expected:
        width, height = png_size(out / name)
        assert width > 300 and height > 200


def test_rows_without_timings_give_only_the_hit_rate_chart(tmp_path: Path) -> None:
    rng = random.Random(1)
    results = check_results({"balanced": [row("prefix-proxy default", 0.8, rng, timed=False)]})
    written = write_charts(results, tmp_path)
    assert [p.name for p in written] == ["hit_rate.png"]
    assert png_size(written[0])[0] > 0


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ([], "rows"),
        ({"balanced": "x"}, "balanced"),
        ({"balanced": [{"name": "a", "hit_rate": "high", "oracle": 0.9}]}, "balanced[0].hit_rate"),
        ({"balanced": [{"hit_rate": 0.5, "oracle": 0.9}]}, "balanced[0].name"),
        ({"b": [{"name": "a", "hit_rate": 0.5, "oracle": 0.9, "ttfts_ms": [1, None]}]}, "ttfts_ms"),
        (
            {"b": [{"name": "a", "hit_rate": 0.5, "oracle": 0.9, "replica_arrivals_s": [3]}]},
            "replica_arrivals_s",
        ),
    ],
)
def test_garbage_rows_are_named_in_the_error(doc: object, where: str) -> None:
    with pytest.raises(ChartInputError, match=where.replace("[", r"\[").replace("]", r"\]")):
        check_results(doc)


def test_command_rejects_an_unreadable_file_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "rows.json"
    bad.write_text("{not json")
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.charts", str(bad), "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.png"))
