"""Micro-benchmark of the prompt hot path: routing text (validate + render the chat template)
and chained block hashes, for agent-like chats of 1k to 128k tokens (~4 characters a token):
a system prompt, a tool list, and many turns of tool calls, tool results and user messages.

    python -m loadtests.bench_prompt [--models qwen3,llama-3.2,...] [--block-chars 128]

Prints microseconds per call: the best of several timeit repeats, timed by this thread's
CPU clock so that other load on a shared machine inflates the numbers less.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable
from datetime import date
from typing import Any

from proxy.prompt import PromptConfig, TemplateRegistry, block_hashes, routing_text

SIZES = (1_000, 8_000, 32_000, 128_000)
CHARS_PER_TOKEN = 4
DAY = date(2025, 3, 4)
LOREM = (
    "The service reads its configuration at startup, validates every field, and reports the "
    "first error with the key path so that operators can fix it without reading the code. "
)


def _tools() -> list[dict[str, Any]]:
    names = ["read_file", "write_file", "run_tests", "search_code", "list_dir", "git_diff"]
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name.replace('_', ' ')}: {LOREM[:120]}",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Path in the repository"},
                        "pattern": {"type": "string", "description": "Optional filter"},
                    },
                    "required": ["path"],
                },
            },
        }
        for name in names
    ]


def agent_chat(tokens: int) -> dict[str, Any]:
    """A chat request body of about ``tokens`` tokens, as an agent resends it each turn."""
    target = tokens * CHARS_PER_TOKEN
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + LOREM * 10},
        {"role": "user", "content": "Fix the failing tests. " + LOREM},
    ]
    size = len(json.dumps(_tools())) + sum(len(m["content"]) for m in messages)
    step = 0
    while size < target:
        call_id = f"call{step:05d}"
        arguments = json.dumps({"path": f"src/module_{step}.py"})
        function = {"name": "read_file", "arguments": arguments}
        output = f"# module {step}\n" + LOREM * 6
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        size += len(arguments) + len(output) + 40
        if step % 5 == 4:
            messages.append({"role": "assistant", "content": "Progress: " + LOREM[:200]})
            messages.append({"role": "user", "content": "Continue. " + LOREM[:150]})
            size += 370
        step += 1
    return {"model": "", "messages": messages, "tools": _tools()}


def best_us(fn: Callable[[], object], budget_s: float = 0.4) -> float:
    """Best per-call time in microseconds over a few repeats sized to ~budget_s in total."""
    timer = timeit.Timer(fn, timer=time.thread_time)
    number, elapsed = 1, 0.0
    while elapsed < budget_s / 10 and number < 100_000:
        elapsed = timer.timeit(number=number)
        number *= 2
    return min(timer.repeat(number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3,Qwen2.5,llama-3.2,mistral-small-3,unknown")
    parser.add_argument("--block-chars", type=int, default=128)
    parser.add_argument("--max-blocks", type=int, default=8192)
    args = parser.parse_args()
    registry = TemplateRegistry(PromptConfig(block_chars=args.block_chars))
    header = f"{'model':<16}{'tokens':>8}{'messages':>9}{'chars':>9}{'blocks':>7}"
    print(header + f"{'render_us':>11}{'hash_us':>9}{'total_us':>10}")
    for model in args.models.split(","):
        for tokens in SIZES:
            body = {**agent_chat(tokens), "model": model}
            text = routing_text("chat", body, registry, DAY)
            hashes = block_hashes(text, args.block_chars, args.max_blocks)
            render = best_us(lambda body=body: routing_text("chat", body, registry, DAY))
            hashing = best_us(
                lambda text=text: block_hashes(text, args.block_chars, args.max_blocks)
            )
            print(
                f"{model:<16}{tokens:>8}{len(body['messages']):>9}{len(text):>9}"
                f"{len(hashes):>7}{render:>11.0f}{hashing:>9.1f}{render + hashing:>10.0f}"
            )
    if registry.template_errors:
        print(f"template errors (fell back): {registry.template_errors}")


if __name__ == "__main__":
    main()
