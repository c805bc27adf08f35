"""Charts of the routing benchmark's rows (``reports/bench_routing.json``) as PNG files.

    python -m loadtests.charts reports/bench_routing.json --out reports/

Writes, for every workload in the file:
  hit_rate.png                 hit rate and share of the oracle per router, oracle marked
  ttft_cdf.png                 TTFT distribution per router (rows with ``ttfts_ms``)
  replica_load_<workload>.png  requests per second per replica over the run (rows with
                               ``replica_arrivals_s``)

Beyond the fields ``bench_routing`` writes today, two optional ones per row feed the last two:
  ttfts_ms            [float]    every successful request's TTFT as the client measured it
  replica_arrivals_s  [[float]]  per replica, in ``per_replica`` order, each request's
                                 arrival in seconds since the run's first arrival (from the
                                 simulators' /sim/stats records: ``arrival_unix`` minus the
                                 smallest one in the run)
Rows without them are left out of those charts. Needs the ``charts`` extra (matplotlib).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator, NullFormatter
except ModuleNotFoundError as e:  # the charts extra is optional
    raise SystemExit("loadtests.charts needs matplotlib: pip install 'prefix-proxy[charts]'") from e

Rows = list[dict[str, Any]]
Results = dict[str, Rows]

HIT = "#3b6fd8"
OF_ORACLE = "#8a63d2"
ORACLE = "#444"
LOAD_POINTS = 200
LOAD_WINDOWS = 15


class ChartInputError(ValueError):
    """The rows file is not what bench_routing writes; the message names the bad field."""


def load_results(path: Path) -> Results:
    """The rows file, checked: {workload: [row, ...]} with the fields the charts read."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ChartInputError(f"{path}: cannot read rows: {e}") from None
    return check_results(doc)


def check_results(doc: Any) -> Results:
    if not isinstance(doc, dict) or not doc:
        raise ChartInputError("rows: expected an object {workload: [row, ...]} with a workload")
    for workload, rows in doc.items():
        if not isinstance(rows, list):
            raise ChartInputError(f"{workload}: expected a list of rows")
        for i, row in enumerate(rows):
            _check_row(f"{workload}[{i}]", row)
    return doc


def _check_row(where: str, row: Any) -> None:
    if not isinstance(row, dict):
        raise ChartInputError(f"{where}: expected an object")
    if not isinstance(row.get("name"), str):
        raise ChartInputError(f"{where}.name: expected a string")
    for key in ("hit_rate", "oracle"):
        if not _is_number(row.get(key)):
            raise ChartInputError(f"{where}.{key}: expected a number")
    for key in ("of_oracle", "errors"):
        if key in row and not _is_number(row[key]):
            raise ChartInputError(f"{where}.{key}: expected a number")
    ttfts = row.get("ttfts_ms")
    if ttfts is not None and not (isinstance(ttfts, list) and all(map(_is_number, ttfts))):
        raise ChartInputError(f"{where}.ttfts_ms: expected a list of numbers")
    arrivals = row.get("replica_arrivals_s")
    if arrivals is not None and not (
        isinstance(arrivals, list)
        and all(isinstance(r, list) and all(map(_is_number, r)) for r in arrivals)
    ):
        raise ChartInputError(f"{where}.replica_arrivals_s: expected a list of lists of numbers")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "workload"


def _label(row: dict[str, Any]) -> str:
    errors = row.get("errors") or 0
    return f"{row['name']} ({errors:g} errors)" if errors else row["name"]


def _of_oracle(row: dict[str, Any]) -> float:
    if "of_oracle" in row:
        return float(row["of_oracle"])
    return row["hit_rate"] / row["oracle"] if row["oracle"] else 0.0


def hit_rate_chart(results: Results, out_dir: Path) -> Path:
    """Per workload: each router's hit rate and its share of the oracle, oracle dashed."""
    heights = [max(1, len(rows)) * 0.55 + 1.2 for rows in results.values()]
    fig = Figure(figsize=(10, sum(heights)), layout="constrained")
    axes = fig.subplots(len(results), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, (workload, rows) in zip(axes, results.items(), strict=True):
        names = [_label(r) for r in rows][::-1]
        ys = range(len(rows))
        hits = [r["hit_rate"] for r in rows][::-1]
        shares = [_of_oracle(r) for r in rows][::-1]
        ax.barh([y + 0.2 for y in ys], hits, height=0.38, color=HIT, label="hit rate")
        ax.barh(
            [y - 0.2 for y in ys], shares, height=0.38, color=OF_ORACLE, label="share of oracle"
        )
        for y, h, s in zip(ys, hits, shares, strict=True):
            ax.text(h + 0.01, y + 0.2, f"{h:.1%}", va="center", fontsize=8)
            ax.text(s + 0.01, y - 0.2, f"{s:.1%}", va="center", fontsize=8)
        oracle = max((r["oracle"] for r in rows), default=0.0)
        if oracle:
            ax.axvline(oracle, color=ORACLE, linestyle="--", linewidth=1, label="oracle hit rate")
        ax.set_yticks(list(ys), names)
        ax.set_xlim(0, 1.12)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
        ax.set_title(workload, loc="left", fontsize=11)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    return _save(fig, out_dir / "hit_rate.png")


def ttft_cdf_chart(results: Results, out_dir: Path) -> Path | None:
    """Per workload: the share of requests with a TTFT at most x, one line per router."""
    measured = {w: [r for r in rows if r.get("ttfts_ms")] for w, rows in results.items()}
    measured = {w: rows for w, rows in measured.items() if rows}
    if not measured:
        return None
    fig = Figure(figsize=(10, 4 * len(measured)), layout="constrained")
    axes = fig.subplots(len(measured), 1, squeeze=False)[:, 0]
    for ax, (workload, rows) in zip(axes, measured.items(), strict=True):
        for row in rows:
            ttfts = sorted(max(x, 0.01) for x in row["ttfts_ms"])
            share = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
            ax.step(ttfts, share, where="post", label=_label(row))
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:g}")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("TTFT (ms, log scale)")
        ax.set_ylabel("share of requests")
        for q in (0.5, 0.99):
            ax.axhline(q, color=ORACLE, linewidth=0.6, linestyle=":")
        ax.set_title(workload, loc="left", fontsize=11)
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="lower right", fontsize=8)
    return _save(fig, out_dir / "ttft_cdf.png")


def replica_load_chart(workload: str, rows: Rows, out_dir: Path) -> Path | None:
    """One panel per router: requests per second reaching each replica over the run.

    The rate at t counts arrivals in a trailing window of 1/LOAD_WINDOWS of the run.
    """
    timed = [r for r in rows if any(r.get("replica_arrivals_s") or [])]
    if not timed:
        return None
    fig = Figure(figsize=(10, 2.6 * len(timed) + 0.6), layout="constrained")
    axes = fig.subplots(len(timed), 1, squeeze=False, sharex=True)[:, 0]
    end = max(max(a, default=0.0) for r in timed for a in r["replica_arrivals_s"])
    window = max(end / LOAD_WINDOWS, 0.1)
    ts = [end * i / LOAD_POINTS for i in range(LOAD_POINTS + 1)]
    for ax, row in zip(axes, timed, strict=True):
        for i, arrivals in enumerate(row["replica_arrivals_s"]):
            ax.plot(ts, _trailing_rate(arrivals, ts, window), label=f"replica {i}", linewidth=1.2)
        ax.set_title(_label(row), loc="left", fontsize=10)
        ax.set_ylabel("req/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1].set_xlabel(f"seconds since the first request (rate over a trailing {window:.1f} s)")
    fig.suptitle(f"requests per replica: {workload}", fontsize=11)
    return _save(fig, out_dir / f"replica_load_{slug(workload)}.png")


def _trailing_rate(arrivals: Sequence[float], ts: Sequence[float], window: float) -> list[float]:
    ordered = sorted(arrivals)
    return [(bisect_right(ordered, t) - bisect_right(ordered, t - window)) / window for t in ts]


def write_charts(results: Results, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [hit_rate_chart(results, out_dir)]
    written.append(ttft_cdf_chart(results, out_dir))
    written += [replica_load_chart(w, rows, out_dir) for w, rows in results.items()]
    return [p for p in written if p is not None]


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("rows", type=Path, help="rows file written by loadtests.bench_routing")
    p.add_argument("--out", type=Path, default=Path("reports"), help="folder for the PNGs")
    args = p.parse_args(argv)
    try:
        results = load_results(args.rows)
    except ChartInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in write_charts(results, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
