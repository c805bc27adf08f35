"""Micro-benchmark of the routing path, without sockets: JSON parse, render (chat template),
block hashes, and the policy decision (prefix lookup + scorers + picker) over 16 backends,
for agent-like chats of 1k, 8k, 32k and 128k tokens; plus the prefix index's memory per
block at 1M indexed blocks.

    python -m loadtests.bench_decision [--model Qwen/Qwen2.5-7B-Instruct] [--policy default]
"""

from __future__ import annotations

import argparse
import gc
import time
import timeit
import tracemalloc
from collections.abc import Callable

import orjson

from loadtests.bench_prompt import SIZES, agent_chat
from proxy.backends.load import LoadSnapshot
from proxy.config import resolve_policy
from proxy.prompt import PromptConfig, TemplateRegistry, block_hashes, routing_text
from proxy.routing.index import PrefixIndex
from proxy.routing.views import BackendView, RequestView

BACKENDS = 16


def best_us(fn: Callable[[], object], budget_s: float = 0.5) -> float:
    """Best-of-5 mean time of ``fn`` in microseconds, with ~budget_s spent per repeat."""
    t = timeit.timeit(fn, number=1)
    number = max(1, int(budget_s / 5 / max(t, 1e-7)))
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def views(now: float) -> list[BackendView]:
    load = LoadSnapshot(dialect="vllm", scraped_at=now, running=4, waiting=1, kv_usage=0.4)
    return [
        BackendView(
            id=f"http://10.0.0.{i}:8000",
            healthy=True,
            draining=False,
            circuit_open=False,
            models=frozenset({"m"}),
            inflight=i % 5,
            load=load,
            load_stale=False,
            inflight_at_scrape=i % 5,
        )
        for i in range(BACKENDS)
    ]


def once_each_us(fn: Callable[[dict], object], bodies: list[dict]) -> float:
    """Mean time of ``fn`` over ``bodies``, each used once (nothing repeats)."""
    t0 = time.perf_counter()
    for body in bodies:
        fn(body)
    return (time.perf_counter() - t0) / len(bodies) * 1e6


def bench_path(model: str, policy_name: str, block_chars: int) -> None:
    """Render + hash three ways: *repeat* (the identical body again: every memo hits),
    *next turn* (the previous body plus a new tool call and result: what an agent sends),
    *cold* (a conversation never seen: nothing shared with anything before)."""
    policy = resolve_policy(policy_name, None)
    registry = TemplateRegistry(PromptConfig(block_chars=block_chars))
    backends = views(0.0)
    print(
        f"model {model!r}, policy {policy_name!r}, {BACKENDS} backends, {block_chars}-byte blocks"
    )
    head = (
        f"{'tokens':>7} {'blocks':>6} {'parse':>7} {'repeat':>7} {'next':>7} {'cold':>7} "
        f"{'decide':>7} {'total next':>10} {'total cold':>10}"
    )
    print(head + "   (microseconds per request; render+hash in repeat/next/cold)")

    def key(body: dict) -> list[int]:
        return block_hashes(routing_text("chat", body, registry) or "", block_chars, 8192)

    for tokens in SIZES:
        base = agent_chat(tokens) | {"model": model}
        raw = orjson.dumps(base)
        hashes = key(base)
        index = PrefixIndex(1_000_000)
        for i, b in enumerate(backends):  # one backend holds it all, others share the start
            index.insert(b.id, hashes if i == 3 else hashes[: len(hashes) // (i + 2)])
        req = RequestView(model, hashes, block_chars / 4, tokens, "session-1", 1, 0.0)
        turns = []
        messages = list(base["messages"])
        for step in range(20):
            arguments = f'{{"path": "new_{step}.py"}}'
            call = {
                "id": f"x{step}",
                "type": "function",
                "function": {"name": "read_file", "arguments": arguments},
            }
            messages = [
                *messages,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"x{step}", "content": f"file {step} " * 40},
            ]
            turns.append(base | {"messages": messages})
        colds = []
        for n in range(8):
            fresh = orjson.loads(raw)
            fresh["messages"][0]["content"] = (
                f"[deployment {n} {time.time_ns()}] " + fresh["messages"][0]["content"]
            )
            colds.append(fresh)
        t_parse = best_us(lambda raw=raw: orjson.loads(raw))
        t_repeat = best_us(lambda b=base: key(b))
        key(base)
        t_next = once_each_us(key, turns)
        t_cold = once_each_us(key, colds)
        t_decide = best_us(lambda r=req, ix=index: policy.decide(r, backends, ix))
        print(
            f"{tokens:>7} {len(hashes):>6} {t_parse:>7.0f} {t_repeat:>7.0f} {t_next:>7.0f} "
            f"{t_cold:>7.0f} {t_decide:>7.0f} {t_parse + t_next + t_decide:>10.0f} "
            f"{t_parse + t_cold + t_decide:>10.0f}"
        )


def bench_index_memory(blocks: int = 1_000_000, backends: int = 16) -> None:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = PrefixIndex(blocks)
    per = blocks // backends
    for b in range(backends):
        chain = [(b << 40) + i for i in range(per)]
        for start in range(0, per, 1000):
            index.insert(f"http://10.0.0.{b}:8000", chain[start : start + 1000])
        del chain
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(
        f"\nprefix index: {index.size():,} blocks over {backends} backends use "
        f"{used / 2**20:.1f} MiB = {used / index.size():.0f} bytes per block"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="Qwen/Qwen2.5-7B-Instruct")
    p.add_argument("--policy", default="default")
    p.add_argument("--block-chars", type=int, default=128)
    p.add_argument("--no-memory", dest="memory", action="store_false")
    args = p.parse_args(argv)
    bench_path(args.model, args.policy, args.block_chars)
    if args.memory:
        bench_index_memory()


if __name__ == "__main__":
    main()
