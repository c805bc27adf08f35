"""Scorers, one per file; the registry below is how policy files name them."""

from proxy.routing.scorers.base import Scorer
from proxy.routing.scorers.inflight import InflightScorer
from proxy.routing.scorers.kv_usage import KvUsageScorer
from proxy.routing.scorers.prefix import PrefixScorer
from proxy.routing.scorers.queue import QueueScorer
from proxy.routing.scorers.round_robin import RoundRobinScorer
from proxy.routing.scorers.running import RunningScorer
from proxy.routing.scorers.session import SessionScorer
from proxy.routing.scorers.ttft import TtftScorer

SCORERS: dict[str, type] = {
    "prefix": PrefixScorer,
    "queue": QueueScorer,
    "running": RunningScorer,
    "kv_usage": KvUsageScorer,
    "inflight": InflightScorer,
    "session": SessionScorer,
    "round_robin": RoundRobinScorer,
    "ttft": TtftScorer,
}

__all__ = ["SCORERS", "Scorer"]
