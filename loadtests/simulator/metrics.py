"""GET /metrics in the engine's own Prometheus names, types and label sets.

vLLM: labels {engine, model_name}, as captured from vLLM 0.32. SGLang: {model_name}, from
its docs. llama.cpp: no labels, the names captured from llama-server; like llama-server,
the throughput gauges cover the time since the previous scrape.
"""

from __future__ import annotations

from loadtests.simulator.config import SimConfig
from loadtests.simulator.engine import Engine
from loadtests.simulator.stats import Histogram, Stats

Labels = dict[str, str]


class Exposition:
    """Builds Prometheus text exposition format 0.0.4."""

    def __init__(self, ints: bool = False) -> None:
        self._lines: list[str] = []
        self._ints = ints

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Labels, value: float) -> None:
        self._lines.append(f"{name}{_labels(labels)} {self._number(value)}")

    def metric(self, name: str, kind: str, help_text: str, labels: Labels, value: float) -> None:
        self.family(name, kind, help_text)
        self.sample(name, labels, value)

    def histogram(self, name: str, help_text: str, labels: Labels, hist: Histogram) -> None:
        self.family(name, "histogram", help_text)
        self.sample(f"{name}_sum", labels, hist.sum)
        for le, count in hist.cumulative():
            self.sample(f"{name}_bucket", {**labels, "le": le}, count)
        self.sample(f"{name}_count", labels, hist.count)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"

    def _number(self, value: float) -> str:
        if self._ints and float(value).is_integer():
            return str(int(value))
        if self._ints:
            return f"{value:.6g}"
        return repr(float(value))


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class MetricsView:
    """Renders one dialect; remembers the previous scrape for interval throughputs."""

    def __init__(self, cfg: SimConfig, engine: Engine, stats: Stats) -> None:
        self.cfg = cfg
        self.engine = engine
        self.stats = stats
        self._last = (0, 0.0, 0, 0.0)

    def render(self) -> str:
        if self.cfg.dialect == "sglang":
            return self._sglang()
        if self.cfg.dialect == "llamacpp":
            return self._llamacpp()
        return self._vllm()

    def _interval_rates(self) -> tuple[float, float]:
        """Prompt and generated tokens per second of model time since the last scrape."""
        t, s = self.stats.totals, self.stats
        current = (t.prompt_tokens - t.cached_tokens, s.prompt_seconds)
        current += (t.generation_tokens, s.decode_seconds)
        prompt, prompt_s, gen, gen_s = (a - b for a, b in zip(current, self._last, strict=True))
        self._last = current
        return (prompt / prompt_s if prompt_s > 0 else 0.0, gen / gen_s if gen_s > 0 else 0.0)

    def _vllm(self) -> str:
        e, s, t = self.engine, self.stats, self.stats.totals
        x = Exposition()
        lab = {"engine": "0", "model_name": self.cfg.model}
        x.metric(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            lab,
            len(e.running),
        )
        x.metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            lab,
            len(e.waiting),
        )
        x.family(
            "vllm:num_requests_waiting_by_reason", "gauge", "Number of waiting requests by reason."
        )
        x.sample(
            "vllm:num_requests_waiting_by_reason", {**lab, "reason": "capacity"}, len(e.waiting)
        )
        x.sample("vllm:num_requests_waiting_by_reason", {**lab, "reason": "deferred"}, 0)
        x.metric(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            lab,
            e.kv_usage,
        )
        x.metric(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            lab,
            t.prompt_tokens,
        )
        x.metric(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            lab,
            t.cached_tokens,
        )
        x.metric(
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            lab,
            0,
        )
        x.metric(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            lab,
            t.prompt_tokens,
        )
        x.family(
            "vllm:prompt_tokens_by_source_total", "counter", "Number of prompt tokens by source."
        )
        for source, value in (
            ("local_compute", t.prompt_tokens - t.cached_tokens),
            ("local_cache_hit", t.cached_tokens),
            ("external_kv_transfer", 0),
        ):
            x.sample("vllm:prompt_tokens_by_source_total", {**lab, "source": source}, value)
        x.metric(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            lab,
            t.generation_tokens,
        )
        x.family(
            "vllm:request_success_total", "counter", "Count of successfully processed requests."
        )
        for reason in ("stop", "length", "abort", "error", "repetition"):
            x.sample(
                "vllm:request_success_total",
                {**lab, "finished_reason": reason},
                s.finish_reasons.get(reason, 0),
            )
        x.histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            lab,
            s.ttft,
        )
        x.histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            lab,
            s.e2e,
        )
        x.histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            lab,
            s.queue_time,
        )
        x.metric(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
            {
                "block_size": str(self.cfg.block_tokens),
                "cache_dtype": "auto",
                "enable_prefix_caching": "True",
                "engine": "0",
                "gpu_memory_utilization": "0.9",
                "kv_cache_size_tokens": str(self.cfg.capacity_tokens),
                "num_cpu_blocks": "None",
                "num_gpu_blocks": str(self.cfg.capacity_tokens // self.cfg.block_tokens),
                "prefix_caching_hash_algo": "sha256",
            },
            1,
        )
        return x.text()

    def _sglang(self) -> str:
        e, s, t = self.engine, self.stats, self.stats.totals
        _, gen_rate = self._interval_rates()
        x = Exposition()
        lab = {"model_name": self.cfg.model}
        x.metric(
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            lab,
            t.prompt_tokens,
        )
        x.metric(
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            lab,
            t.generation_tokens,
        )
        x.metric(
            "sglang:cached_tokens_total",
            "counter",
            "Number of cached prompt tokens.",
            lab,
            t.cached_tokens,
        )
        x.metric(
            "sglang:num_requests_total",
            "counter",
            "Number of requests processed.",
            lab,
            s.totals.finished,
        )
        x.metric(
            "sglang:num_aborted_requests_total",
            "counter",
            "Number of requests aborted.",
            lab,
            t.aborts,
        )
        x.metric("sglang:token_usage", "gauge", "The token usage", lab, e.kv_usage)
        x.metric(
            "sglang:cache_hit_rate",
            "gauge",
            "The cache hit rate",
            lab,
            t.cached_tokens / t.prompt_tokens if t.prompt_tokens else 0.0,
        )
        x.histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            lab,
            s.ttft,
        )
        x.histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            lab,
            s.e2e,
        )
        x.metric(
            "sglang:num_running_reqs",
            "gauge",
            "The number of running requests",
            lab,
            len(e.running),
        )
        x.metric("sglang:num_used_tokens", "gauge", "The number of used tokens", lab, e.used_tokens)
        x.metric(
            "sglang:max_total_num_tokens",
            "gauge",
            "Maximum total number of tokens",
            lab,
            self.cfg.capacity_tokens,
        )
        x.metric(
            "sglang:gen_throughput", "gauge", "The generate throughput (token/s)", lab, gen_rate
        )
        x.metric(
            "sglang:num_queue_reqs",
            "gauge",
            "The number of requests in the waiting queue",
            lab,
            len(e.waiting),
        )
        return x.text()

    def _llamacpp(self) -> str:
        e, s, t = self.engine, self.stats, self.stats.totals
        prompt_rate, gen_rate = self._interval_rates()
        x = Exposition(ints=True)
        for name, kind, help_text, value in (
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed, excluding cached tokens",
                t.prompt_tokens - t.cached_tokens,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens reused from the cache",
                t.cached_tokens,
            ),
            (
                "prompt_seconds_total",
                "counter",
                "Total time spent processing prompts",
                s.prompt_seconds,
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed",
                t.generation_tokens,
            ),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Total time spent generating tokens",
                s.decode_seconds,
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of llama_decode() calls, excluding speculative decoding and "
                "multimodal decoding",
                s.decode_steps,
            ),
            (
                "n_tokens_max",
                "counter",
                "Largest observed sequence length (prompt + generation)",
                s.max_seq_tokens,
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "Speculative: Total draft tokens generated",
                0,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Speculative: Total draft tokens accepted by the target model",
                0,
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "Speculative: Total speculative decoding verification steps",
                0,
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s",
                prompt_rate,
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s",
                gen_rate,
            ),
            ("requests_processing", "gauge", "Number of requests processing", len(e.running)),
            ("requests_deferred", "gauge", "Number of requests deferred", len(e.waiting)),
            (
                "n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per llama_decode() call",
                s.busy_slot_steps / s.decode_steps if s.decode_steps else 0,
            ),
        ):
            x.metric(f"llamacpp:{name}", kind, help_text, {}, value)
        return x.text()
