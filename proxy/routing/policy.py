"""A routing policy: filters -> weighted scorers -> picker, assembled from a config mapping.

``Policy.decide`` is pure: everything it reads is passed in (request view, backend views,
prefix index), so it is unit-tested and benchmarked without sockets or clocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from proxy.routing.filters import FILTERS, Filter
from proxy.routing.index import PrefixIndex
from proxy.routing.load import outstanding
from proxy.routing.picker import BoundedLoadPicker
from proxy.routing.scorers import SCORERS, Scorer
from proxy.routing.views import BackendView, Decision, RequestView

DEFAULT_FILTERS = ("healthy", "serves_model", "not_draining", "circuit_closed")


class PolicyError(ValueError):
    """An invalid policy mapping; ``path`` names the offending key (e.g. ``scorers.prefix``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.detail = message


@dataclass(slots=True)
class Policy:
    name: str
    filters: list[tuple[str, Filter]]
    scorers: list[Scorer]
    picker: BoundedLoadPicker

    def decide(
        self, req: RequestView, backends: Sequence[BackendView], index: PrefixIndex
    ) -> Decision:
        if not backends:
            return Decision(ranked=[], reason="no_backends")
        candidates = list(backends)
        for fname, keep in self.filters:
            kept = [b for b in candidates if keep(req, b)]
            if not kept:
                return Decision(ranked=[], reason=f"filtered_{fname}")
            candidates = kept

        if len(candidates) == 1:  # nothing to weigh
            only = candidates[0].id
            return Decision(
                ranked=[only],
                reason="only_candidate",
                matched_blocks={only: index.match(only, req.block_hashes)},
            )
        ids = [b.id for b in candidates]
        matched = [index.match(i, req.block_hashes) for i in ids]
        totals = [0.0] * len(candidates)
        per_scorer: dict[str, list[float]] = {}
        for scorer in self.scorers:
            values = scorer.score(req, candidates, matched)
            per_scorer[scorer.name] = values
            w = scorer.weight
            for i, v in enumerate(values):
                totals[i] += w * v

        seed = xxhash.xxh3_64_intdigest(_affinity_key(req).encode())
        tiebreak = [xxhash.xxh3_64_intdigest(i.encode(), seed=seed) for i in ids]
        loads = [outstanding(b) for b in candidates]
        order, overruled = self.picker.rank(totals, loads, tiebreak)

        return Decision(
            ranked=[ids[i] for i in order],
            reason=self._reason(order, totals, per_scorer, overruled),
            matched_blocks=dict(zip(ids, matched, strict=True)),
            scores={
                ids[i]: {name: values[i] for name, values in per_scorer.items()}
                for i in range(len(ids))
            },
            total=dict(zip(ids, totals, strict=True)),
        )

    def _reason(
        self,
        order: list[int],
        totals: list[float],
        per_scorer: dict[str, list[float]],
        overruled: bool,
    ) -> str:
        if overruled:
            return "bounded_load"
        win, runner = order[0], order[1]
        best_name, best_gap = "tiebreak", 0.0
        for scorer in self.scorers:
            values = per_scorer[scorer.name]
            gap = scorer.weight * (values[win] - values[runner])
            if gap > best_gap + 1e-12:
                best_name, best_gap = scorer.name, gap
        return best_name


def _affinity_key(req: RequestView) -> str:
    """What ties are broken on: the session, else the prompt's first block, else the request."""
    if req.session_key is not None:
        return req.session_key
    if req.block_hashes:
        return str(req.block_hashes[0])
    return str(req.seq)


def build_policy(spec: Mapping[str, Any]) -> Policy:
    """Build a Policy from a mapping (a parsed policy YAML), or raise PolicyError."""
    if not isinstance(spec, Mapping):
        raise PolicyError("", "a policy must be a mapping")
    unknown = set(spec) - {"name", "description", "filters", "scorers", "picker"}
    if unknown:
        raise PolicyError(sorted(unknown)[0], "unknown key")
    name = spec.get("name", "custom")
    if not isinstance(name, str):
        raise PolicyError("name", "must be a string")
    return Policy(
        name=name,
        filters=_build_filters(spec.get("filters", list(DEFAULT_FILTERS))),
        scorers=_build_scorers(spec.get("scorers", {})),
        picker=_build_picker(spec.get("picker", {"name": "bounded_load"})),
    )


def _build_filters(raw: Any) -> list[tuple[str, Filter]]:
    if not isinstance(raw, list):
        raise PolicyError("filters", "must be a list of filter names")
    out = []
    for i, fname in enumerate(raw):
        if fname not in FILTERS:
            raise PolicyError(
                f"filters[{i}]", f"unknown filter {fname!r}; known: {sorted(FILTERS)}"
            )
        out.append((fname, FILTERS[fname]))
    return out


def _build_scorers(raw: Any) -> list[Scorer]:
    if not isinstance(raw, Mapping) or not raw:
        raise PolicyError("scorers", "must be a non-empty mapping of scorer name -> parameters")
    out = []
    for sname, params in raw.items():
        path = f"scorers.{sname}"
        cls = SCORERS.get(sname)
        if cls is None:
            raise PolicyError(path, f"unknown scorer; known: {sorted(SCORERS)}")
        out.append(_construct(cls, params if params is not None else {}, path))
    return out


def _build_picker(raw: Any) -> BoundedLoadPicker:
    if not isinstance(raw, Mapping):
        raise PolicyError("picker", "must be a mapping like {name: bounded_load, epsilon: 0.25}")
    params = dict(raw)
    kind = params.pop("name", "bounded_load")
    if kind == "max_score":
        if params:
            raise PolicyError(f"picker.{sorted(params)[0]}", "max_score takes no parameters")
        return BoundedLoadPicker(epsilon=None)
    if kind != "bounded_load":
        raise PolicyError("picker.name", "must be 'bounded_load' or 'max_score'")
    picker = _construct(BoundedLoadPicker, params, "picker")
    if picker.epsilon is not None and picker.epsilon < 0:
        raise PolicyError("picker.epsilon", "must be >= 0")
    return picker


def _construct(cls: type, params: Any, path: str) -> Any:
    """Instantiate a dataclass from a mapping, checking names and numeric types."""
    if not isinstance(params, Mapping):
        raise PolicyError(path, "must be a mapping of parameters")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name"}
    kwargs = {}
    for key, value in params.items():
        if key not in fields:
            raise PolicyError(f"{path}.{key}", f"unknown parameter; known: {sorted(fields)}")
        default = fields[key].default
        if isinstance(default, float) or (default is None and value is not None):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PolicyError(f"{path}.{key}", f"must be a number, got {value!r}")
            value = float(value)
        kwargs[key] = value
    if "weight" in kwargs and kwargs["weight"] < 0:
        raise PolicyError(f"{path}.weight", "must be >= 0")
    for key in ("scale", "floor_ms"):
        if key in kwargs and kwargs[key] <= 0:
            raise PolicyError(f"{path}.{key}", "must be > 0")
    return cls(**kwargs)
