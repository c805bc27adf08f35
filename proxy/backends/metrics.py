"""Turn an engine's /metrics text into normalized load snapshots. Pure; never raises.

Only the lines the dialect table names are handed to prometheus-client's own text
parser, one line at a time: a 50 kB vLLM page costs a handful of parser calls, and a
torn or garbled line costs that line only (counted in ``problems``), not the scrape.
Working on sample names (which keep ``_total``) rather than family names (where the
parser strips it from counters) keeps the table identical to what engines print.

Which snapshot the router uses: ``MetricsReading.engine``, the whole engine. Queue,
batch and KV pool are shared by everything one engine serves, so that is what load
balancing must compare. ``by_model`` splits the same numbers by the ``model_name``
label for dashboards and for engines that front several models.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from proxy.backends.dialects import DIALECTS, Dialect
from proxy.backends.load import LoadSnapshot

# Shares of a whole: averaged when parts are combined. Every other field is summed.
FRACTION_FIELDS = frozenset({"kv_usage", "cache_hit_rate"})
# Averages of these are weighted by that field of each part (a big pool counts more).
FRACTION_WEIGHTS: Mapping[str, str] = {"kv_usage": "kv_capacity_tokens"}

# Far beyond any real token count; keeps sums of parts finite.
MAX_VALUE = 1e15

_SAMPLE_NAME = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")

PartKey = tuple[str | None, str]  # (model, partition label value)


@dataclass(frozen=True, slots=True)
class MetricsReading:
    """The result of one parse.

    ``problems`` holds short stable codes (``kind`` or ``kind:name``) the caller can
    count as a metric label or log; it is empty when the page was clean. ``engine`` is
    None when nothing usable was found; a snapshot with some fields None is a partial
    reading, not an error.
    """

    dialect: str | None
    engine: LoadSnapshot | None
    by_model: Mapping[str, LoadSnapshot] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def detect_dialect(names: Iterable[str]) -> str | None:
    """The dialect whose prefix most of these metric names carry, or None."""
    counts = dict.fromkeys(DIALECTS, 0)
    for name in set(names):
        for dialect in DIALECTS.values():
            if name.startswith(dialect.prefix):
                counts[dialect.name] += 1
    best = max(counts, key=counts.__getitem__)
    return best if counts[best] else None


def parse_metrics(text: str | bytes, now: float, dialect: str | None = None) -> MetricsReading:
    """Parse one scrape. ``dialect`` forces the engine family instead of detecting it."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    lines = [(m.group(1), line) for line in text.splitlines() if (m := _SAMPLE_NAME.match(line))]
    if not lines:
        return MetricsReading(dialect, None, problems=("no_samples",))
    name = dialect or detect_dialect(n for n, _ in lines)
    table = DIALECTS.get(name) if name else None
    if table is None:
        return MetricsReading(name, None, problems=("unknown_dialect",))

    problems: dict[str, None] = {}
    raw = _collect(table, lines, problems)
    parts = {key: _fields(table, values, problems) for key, values in raw.items()}
    engine = _snapshot(table.name, now, _combine(list(parts.values())))
    if engine is None:
        problems["no_load_fields"] = None
    by_model: dict[str, LoadSnapshot] = {}
    for model in sorted({m for m, _ in parts if m is not None}):
        snap = _snapshot(
            table.name, now, _combine([v for (m, _), v in parts.items() if m == model])
        )
        if snap is not None:
            by_model[model] = snap
    return MetricsReading(table.name, engine, by_model, tuple(problems))


def engine_hit_rate(prev: LoadSnapshot | None, cur: LoadSnapshot) -> float | None:
    """The engine's own prefix-cache hit rate between two scrapes.

    Delta hit tokens / delta queried tokens when both scrapes carry the counters; a
    counter that went backwards (engine restart) counts from zero. Otherwise the
    engine's own hit-rate gauge (SGLang, old vLLM). None when no tokens were queried
    between the scrapes or there is no signal at all.
    """
    hits, queries = cur.cache_hit_tokens, cur.cache_query_tokens
    if prev is None or hits is None or queries is None:
        return cur.cache_hit_rate
    prev_hits, prev_queries = prev.cache_hit_tokens, prev.cache_query_tokens
    if prev_hits is None or prev_queries is None:
        return cur.cache_hit_rate
    restarted = hits < prev_hits or queries < prev_queries or prev.dialect != cur.dialect
    if not restarted:
        hits, queries = hits - prev_hits, queries - prev_queries
    if queries <= 0:
        return None
    return min(max(hits / queries, 0.0), 1.0)


def _collect(
    table: Dialect, lines: list[tuple[str, str]], problems: dict[str, None]
) -> dict[PartKey, dict[str, float]]:
    """Valid values of the metrics the table reads, grouped by (model, partition).

    Copies of one series (same part, other labels differ) keep the largest value.
    """
    wanted = table.metric_names
    label_reads = {
        r.metrics[0]: r.from_labels for rs in table.fields.values() for r in rs if r.from_labels
    }
    out: dict[PartKey, dict[str, float]] = {}
    for name, line in lines:
        if name not in wanted:
            continue
        for sample_name, labels, value in _samples(line, problems):
            if sample_name not in wanted:
                continue
            if sample_name in label_reads:
                value = _label_product(labels, label_reads[sample_name])
                if value is None:
                    problems[f"bad_label:{sample_name}"] = None
                    continue
            elif not math.isfinite(value):
                problems[f"nonfinite:{sample_name}"] = None
                continue
            elif value < 0:
                problems[f"negative:{sample_name}"] = None
                continue
            if value > MAX_VALUE:
                problems[f"too_large:{sample_name}"] = None
                continue
            model = next((labels[k] for k in table.model_labels if k in labels), None)
            part = labels.get(table.partition_label, "") if table.partition_label else ""
            _keep_max(out.setdefault((model, part), {}), sample_name, value)
    return _adopt_unlabelled(out)


def _keep_max(values: dict[str, float], name: str, value: float) -> None:
    values[name] = max(value, values.get(name, value))


def _adopt_unlabelled(
    parts: dict[PartKey, dict[str, float]],
) -> dict[PartKey, dict[str, float]]:
    """Give model-less series (vLLM's cache_config_info) to the one model of their partition."""
    for model, part in [k for k in parts if k[0] is None]:
        models = {m for m, p in parts if p == part and m is not None}
        if len(models) == 1:
            owner = parts.setdefault((models.pop(), part), {})
            for name, value in parts.pop((model, part)).items():
                _keep_max(owner, name, value)
    return parts


def _samples(line: str, problems: dict[str, None]) -> list[tuple[str, dict[str, str], float]]:
    """The samples of one exposition line, or none (and a problem) if it is malformed."""
    try:
        return [
            (s.name, s.labels, float(s.value))
            for family in text_string_to_metric_families(line + "\n")
            for s in family.samples
        ]
    except Exception:  # third-party parser on untrusted input: any failure is a bad line
        problems["bad_line"] = None
        return []


def _label_product(labels: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    """Product of integer labels (e.g. blocks x block size); None if any is missing or silly."""
    product = 1
    for name in names:
        raw = labels.get(name, "")
        if not raw.isdigit() or int(raw) <= 0:
            return None
        product *= int(raw)
    return float(product)


def _fields(
    table: Dialect, values: Mapping[str, float], problems: dict[str, None]
) -> dict[str, float]:
    """Normalized fields of one part: per field, the first read whose metrics are all present."""
    out: dict[str, float] = {}
    for name, reads in table.fields.items():
        read = next((r for r in reads if all(m in values for m in r.metrics)), None)
        if read is None:
            continue
        value = sum(values[m] for m in read.metrics)
        if not _in_range(name, value):
            problems[f"out_of_range:{name}"] = None
            continue
        out[name] = value
    return out


def _in_range(name: str, value: float) -> bool:
    if name in FRACTION_FIELDS:
        return value <= 1.0
    if name == "kv_capacity_tokens":
        return value >= 1.0
    return True


def _combine(parts: list[dict[str, float]]) -> dict[str, float]:
    """One engine's (or model's) fields from its parts: counts add, shares average."""
    out: dict[str, float] = {}
    for name in {k for p in parts for k in p}:
        having = [p for p in parts if name in p]
        if name not in FRACTION_FIELDS:
            out[name] = sum(p[name] for p in having)
            continue
        weight = FRACTION_WEIGHTS.get(name)
        weights = [p.get(weight, 0.0) if weight else 1.0 for p in having]
        if not all(weights):
            weights = [1.0] * len(having)
        out[name] = sum(p[name] * w for p, w in zip(having, weights, strict=True)) / sum(weights)
    return out


def _snapshot(dialect: str, now: float, fields: dict[str, float]) -> LoadSnapshot | None:
    if not fields:
        return None
    capacity = fields.pop("kv_capacity_tokens", None)
    return LoadSnapshot(
        dialect=dialect,
        scraped_at=now,
        kv_capacity_tokens=int(capacity) if capacity is not None else None,
        **fields,
    )
