"""The one table from each engine's Prometheus names to the normalized load fields.

Adding an engine is adding a row to ``DIALECTS``. Names are *sample* names as they
appear on the wire (counters keep their ``_total``), so the table reads the same
whether or not the engine declares ``# TYPE`` lines.

Each field lists the ways to read it in order of preference; the first one whose
metrics are all present wins, so old and new spellings of one signal (vLLM renamed
several around 0.9-0.10 and exported both for a while) are never double counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Read:
    """One way to read a field.

    By default the value is the sum of the named metrics' sample values. With
    ``from_labels`` it is instead the product of those integer labels of the
    (single) named info metric, e.g. vLLM's ``num_gpu_blocks`` x ``block_size``.
    """

    metrics: tuple[str, ...]
    from_labels: tuple[str, ...] = ()


def metric(*names: str) -> Read:
    """The sum of these metrics' values."""
    return Read(names)


def label_product(info_metric: str, *labels: str) -> Read:
    """The product of these integer labels of an info metric."""
    return Read((info_metric,), labels)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one engine family exposes its load.

    ``model_labels``: labels that name the served model (first present wins).
    ``partition_label``: splits one engine into parts whose loads add up (vLLM
    data-parallel ``engine`` index, SGLang ``dp_rank``); series that differ in any
    other label (e.g. SGLang ``tp_rank``) are copies of one quantity, not parts.
    """

    name: str
    prefix: str
    model_labels: tuple[str, ...]
    partition_label: str | None
    fields: Mapping[str, tuple[Read, ...]]

    @property
    def metric_names(self) -> frozenset[str]:
        """Every sample name this dialect reads."""
        return frozenset(n for reads in self.fields.values() for r in reads for n in r.metrics)


VLLM = Dialect(
    name="vllm",
    prefix="vllm:",
    model_labels=("model_name",),
    partition_label="engine",
    fields={
        "running": (metric("vllm:num_requests_running"),),
        "waiting": (metric("vllm:num_requests_waiting"),),
        "kv_usage": (
            metric("vllm:kv_cache_usage_perc"),
            metric("vllm:gpu_cache_usage_perc"),  # before 0.9
        ),
        "kv_capacity_tokens": (
            label_product("vllm:cache_config_info", "num_gpu_blocks", "block_size"),
        ),
        "cache_hit_tokens": (
            metric("vllm:prefix_cache_hits_total"),
            metric("vllm:gpu_prefix_cache_hits_total"),  # V1 engine before 0.10
        ),
        "cache_query_tokens": (
            metric("vllm:prefix_cache_queries_total"),
            metric("vllm:gpu_prefix_cache_queries_total"),
        ),
        "cache_hit_rate": (metric("vllm:gpu_prefix_cache_hit_rate"),),  # V0 engine gauge
    },
)

SGLANG = Dialect(
    name="sglang",
    prefix="sglang:",
    model_labels=("model_name", "name"),  # "name" in releases before 0.4
    partition_label="dp_rank",
    fields={
        "running": (metric("sglang:num_running_reqs"),),
        "waiting": (metric("sglang:num_queue_reqs"),),
        "kv_usage": (metric("sglang:token_usage"),),
        "kv_capacity_tokens": (metric("sglang:max_total_num_tokens"),),
        # Tokenizer-side counters: prompt tokens include the cached ones.
        "cache_hit_tokens": (metric("sglang:cached_tokens_total"),),
        "cache_query_tokens": (metric("sglang:prompt_tokens_total"),),
        "cache_hit_rate": (metric("sglang:cache_hit_rate"),),
    },
)

LLAMACPP = Dialect(
    name="llamacpp",
    prefix="llamacpp:",
    model_labels=(),
    partition_label=None,
    fields={
        "running": (metric("llamacpp:requests_processing"),),
        "waiting": (metric("llamacpp:requests_deferred"),),
        # No KV gauge: kv_usage and capacity come from /slots and /props (llamacpp.py).
        "cache_hit_tokens": (metric("llamacpp:prompt_tokens_cached_total"),),
        # prompt_tokens_total counts only the tokens it computed, cached ones excluded.
        "cache_query_tokens": (
            metric("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
        ),
    },
)

DIALECTS: Mapping[str, Dialect] = {d.name: d for d in (VLLM, SGLANG, LLAMACPP)}
