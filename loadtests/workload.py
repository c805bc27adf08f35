"""Agent-fleet traffic: a seeded plan of sessions and an async driver that replays it.

An agent resends its whole, growing conversation every turn: one of a few long shared
system prompts with tool definitions, then user messages, the real assistant replies, and
sometimes a tool call with its result. One-shot requests (system prompt + one question)
are mixed in. Set ``hot_prompt_share=0.7`` for the skewed variant where one system prompt
takes 70% of the sessions.

The plan (all texts, which agent, which turns call tools) depends only on the spec and its
seed; only the assistant replies come from the server.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

WORDS = (
    "the", "agent", "reads", "a", "file", "and", "writes", "code", "to", "fix", "failing", "test",
    "before", "it", "runs", "build", "again", "then", "checks", "logs", "for", "errors", "in",
    "service", "config", "while", "user", "waits", "short", "summary", "of", "changes", "made",
    "repository", "with", "notes", "on", "risk", "rollout", "next", "steps", "including",
    "database", "migration", "cache", "warmup", "queue", "depth", "latency", "budget", "retry",
    "policy", "timeout", "value", "memory", "limit", "thread", "pool", "request", "trace",
    "metric", "label", "alert", "rule", "dashboard", "panel", "deploy", "stage", "review",
    "comment", "branch", "merge", "conflict", "patch", "release", "tag",
)  # fmt: skip
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The shape of the traffic. Token sizes are approximate (4 characters a token)."""

    sessions: int = 16
    turns: int = 4
    concurrency: int = 8
    one_shot_share: float = 0.1
    hot_prompt_share: float | None = None
    seed: int = 0
    system_prompts: int = 3
    system_prompt_tokens: int = 1500
    tools_per_prompt: int = 6
    user_tokens: tuple[int, int] = (20, 120)
    tool_call_share: float = 0.3
    tool_result_tokens: tuple[int, int] = (40, 300)
    max_tokens: int = 32

    def __post_init__(self) -> None:
        if self.sessions < 0 or self.turns < 1 or self.concurrency < 1:
            raise ValueError("sessions >= 0, turns >= 1 and concurrency >= 1 are required")
        if not 0 <= self.one_shot_share < 1:
            raise ValueError("one_shot_share must be in [0, 1)")
        if self.hot_prompt_share is not None and not 0 < self.hot_prompt_share <= 1:
            raise ValueError("hot_prompt_share must be in (0, 1]")
        if self.system_prompts < 1 or self.tools_per_prompt < 0 or self.max_tokens < 1:
            raise ValueError("system_prompts >= 1, tools_per_prompt >= 0, max_tokens >= 1")


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """What the client adds before a request: a user message, or a tool call and result."""

    kind: str
    text: str
    tool_name: str | None = None
    tool_arguments: str | None = None


@dataclass(frozen=True, slots=True)
class SessionPlan:
    id: str
    agent: int
    one_shot: bool
    turns: tuple[TurnPlan, ...]


@dataclass(frozen=True, slots=True)
class Agent:
    """A shared system prompt and its tools."""

    system_prompt: str
    tools: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    agents: tuple[Agent, ...]
    sessions: tuple[SessionPlan, ...]

    @property
    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def build_plan(spec: WorkloadSpec) -> WorkloadPlan:
    """The deterministic plan for ``spec``: equal specs give equal plans."""
    rng = random.Random(spec.seed)
    agents = tuple(_agent(rng, i, spec) for i in range(spec.system_prompts))
    weights = _agent_weights(spec)
    multi = spec.sessions * spec.turns
    one_shots = round(multi * spec.one_shot_share / (1 - spec.one_shot_share))
    sessions: list[SessionPlan] = []
    for i in range(spec.sessions):
        agent = rng.choices(range(spec.system_prompts), weights)[0]
        turns = [_user_turn(rng, spec)]
        for _ in range(spec.turns - 1):
            use_tool = agents[agent].tools and rng.random() < spec.tool_call_share
            turns.append(
                _tool_turn(rng, spec, agents[agent]) if use_tool else _user_turn(rng, spec)
            )
        sessions.append(SessionPlan(f"s{i}", agent, False, tuple(turns)))
    for i in range(one_shots):
        agent = rng.choices(range(spec.system_prompts), weights)[0]
        sessions.append(SessionPlan(f"o{i}", agent, True, (_user_turn(rng, spec),)))
    rng.shuffle(sessions)
    return WorkloadPlan(agents, tuple(sessions))


def _agent_weights(spec: WorkloadSpec) -> list[float]:
    n = spec.system_prompts
    if spec.hot_prompt_share is None or n == 1:
        return [1.0] * n
    rest = (1 - spec.hot_prompt_share) / (n - 1)
    return [spec.hot_prompt_share] + [rest] * (n - 1)


def _words(rng: random.Random, tokens: int) -> str:
    out: list[str] = []
    length = 0
    while length < tokens * CHARS_PER_TOKEN:
        word = rng.choice(WORDS)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)


def _agent(rng: random.Random, index: int, spec: WorkloadSpec) -> Agent:
    prompt = (
        f"You are agent {index}, an autonomous software engineer. Follow the rules below. "
        + _words(rng, spec.system_prompt_tokens)
    )
    tools = []
    for j in range(spec.tools_per_prompt):
        params = [f"{rng.choice(WORDS)}_{k}" for k in range(3)]
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{index}_{j}_{rng.choice(WORDS)}",
                    "description": _words(rng, 30),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            p: {"type": "string", "description": _words(rng, 8)} for p in params
                        },
                        "required": params[:1],
                    },
                },
            }
        )
    return Agent(prompt, tuple(tools))


def _user_turn(rng: random.Random, spec: WorkloadSpec) -> TurnPlan:
    return TurnPlan("user", _words(rng, rng.randint(*spec.user_tokens)))


def _tool_turn(rng: random.Random, spec: WorkloadSpec, agent: Agent) -> TurnPlan:
    tool = rng.choice(agent.tools)["function"]
    args = {name: rng.choice(WORDS) for name in tool["parameters"]["required"]}
    return TurnPlan(
        "tool",
        _words(rng, rng.randint(*spec.tool_result_tokens)),
        tool_name=tool["name"],
        tool_arguments=json.dumps(args),
    )


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it. Times in seconds; ``start_s`` from the run start."""

    session_id: str
    turn: int
    one_shot: bool
    start_s: float
    e2e_s: float
    ttft_s: float | None = None
    status: int | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    requests: int
    ok: int
    errors: int
    skipped: int
    wall_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    req_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    cached_tokens: int
    reported_hit_rate: float


@dataclass(slots=True)
class WorkloadResult:
    """Every request sent; ``skipped`` counts planned requests never sent (deadline, errors)."""

    records: list[RequestResult] = field(default_factory=list)
    planned: int = 0
    wall_s: float = 0.0
    deadline_hit: bool = False

    @property
    def skipped(self) -> int:
        return self.planned - len(self.records)

    def summary(self) -> WorkloadSummary:
        ok = [r for r in self.records if r.ok]
        wall = max(self.wall_s, 1e-9)
        prompt = sum(r.prompt_tokens for r in ok)
        cached = sum(r.cached_tokens for r in ok)
        ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
        e2es = sorted(r.e2e_s for r in ok)
        return WorkloadSummary(
            requests=len(self.records),
            ok=len(ok),
            errors=len(self.records) - len(ok),
            skipped=self.skipped,
            wall_s=self.wall_s,
            ttft_p50_s=percentile(ttfts, 50),
            ttft_p99_s=percentile(ttfts, 99),
            e2e_p50_s=percentile(e2es, 50),
            e2e_p99_s=percentile(e2es, 99),
            req_per_s=len(ok) / wall,
            output_tokens_per_s=sum(r.completion_tokens for r in ok) / wall,
            prompt_tokens=prompt,
            cached_tokens=cached,
            reported_hit_rate=cached / prompt if prompt else 0.0,
        )


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


ProgressFn = Callable[[int, int, RequestResult], None]


async def run_workload(
    base_url: str | Sequence[str],
    spec: WorkloadSpec,
    *,
    model: str,
    stream: bool = True,
    on_progress: ProgressFn | None = None,
    deadline_s: float = 60.0,
    request_timeout_s: float = 30.0,
) -> WorkloadResult:
    """Replay ``spec`` against ``base_url`` (a proxy or one engine; given several, each
    request goes to one picked at random) with ``concurrency`` sessions in flight. Each turn
    waits for the previous answer and appends its real text. No request starts after
    ``deadline_s``, and none runs past it.
    """
    plan = build_plan(spec)
    result = WorkloadResult(planned=plan.requests)
    pending = deque(plan.sessions)
    connector = aiohttp.TCPConnector(limit=spec.concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as http:
        driver = _Driver(
            http=http,
            urls=[
                u.rstrip("/") + "/v1/chat/completions"
                for u in ([base_url] if isinstance(base_url, str) else base_url)
            ],
            pick=random.Random(spec.seed + 1),
            plan=plan,
            model=model,
            max_tokens=spec.max_tokens,
            stream=stream,
            deadline=time.monotonic() + deadline_s,
            request_timeout_s=request_timeout_s,
            result=result,
            on_progress=on_progress,
        )

        async def worker() -> None:
            while pending and not driver.expired():
                await driver.run_session(pending.popleft())

        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        result.deadline_hit = result.skipped > 0 and driver.expired()
        result.wall_s = time.monotonic() - driver.started
    return result


@dataclass(slots=True)
class _Driver:
    http: aiohttp.ClientSession
    urls: list[str]
    pick: random.Random
    plan: WorkloadPlan
    model: str
    max_tokens: int
    stream: bool
    deadline: float
    request_timeout_s: float
    result: WorkloadResult
    on_progress: ProgressFn | None
    started: float = field(default_factory=time.monotonic)

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    async def run_session(self, session: SessionPlan) -> None:
        """Send the session's turns in order; stop at the first failure or the deadline."""
        agent = self.plan.agents[session.agent]
        messages: list[dict[str, Any]] = [{"role": "system", "content": agent.system_prompt}]
        for index, turn in enumerate(session.turns):
            if self.expired():
                return
            if turn.kind == "tool":
                call_id = f"call_{session.id}_{index}"
                messages[-1]["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": turn.tool_name, "arguments": turn.tool_arguments},
                    }
                ]
                messages.append({"role": "tool", "tool_call_id": call_id, "content": turn.text})
            else:
                messages.append({"role": "user", "content": turn.text})
            headers = {"Content-Type": "application/json", "X-Request-ID": f"{session.id}-{index}"}
            if not session.one_shot:
                headers["X-Session-ID"] = session.id
            body: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "max_tokens": self.max_tokens,
                "stream": self.stream,
            }
            if agent.tools:  # engines reject an empty tools list
                body["tools"] = list(agent.tools)
            if self.stream:
                body["stream_options"] = {"include_usage": True}
            record = RequestResult(session.id, index, session.one_shot, 0.0, 0.0)
            reply = await self._send(body, headers, record)
            self.result.records.append(record)
            if self.on_progress is not None:
                self.on_progress(len(self.result.records), self.result.planned, record)
            if reply is None:
                return
            messages.append({"role": "assistant", "content": reply})

    async def _send(
        self, body: dict[str, Any], headers: dict[str, str], record: RequestResult
    ) -> str | None:
        """Fill ``record``; return the reply text, or None on failure."""
        begin = time.monotonic()
        record.start_s = begin - self.started
        timeout = aiohttp.ClientTimeout(
            total=max(0.001, min(self.request_timeout_s, self.deadline - begin))
        )
        try:
            async with self.http.post(
                self.pick.choice(self.urls),
                data=orjson.dumps(body),
                headers=headers,
                timeout=timeout,
            ) as resp:
                record.status = resp.status
                if resp.status != 200:
                    record.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return None
                if self.stream:
                    text, usage = await self._read_stream(resp, record, begin)
                else:
                    answer = orjson.loads(await resp.read())
                    text = answer["choices"][0]["message"]["content"] or ""
                    usage = answer.get("usage")
                    record.ttft_s = time.monotonic() - begin
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as e:
            record.error = f"{type(e).__name__}: {e}"
            return None
        finally:
            record.e2e_s = time.monotonic() - begin
        _apply_usage(record, usage)
        return text

    @staticmethod
    async def _read_stream(
        resp: aiohttp.ClientResponse, record: RequestResult, begin: float
    ) -> tuple[str, dict[str, Any] | None]:
        parts: list[str] = []
        usage = None
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return "".join(parts), usage
            chunk = orjson.loads(data)
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if record.ttft_s is None:
                        record.ttft_s = time.monotonic() - begin
                    parts.append(content)
            usage = chunk.get("usage") or usage
        raise ValueError("stream ended without [DONE]")


def _apply_usage(record: RequestResult, usage: dict[str, Any] | None) -> None:
    if not isinstance(usage, dict):
        return
    record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    record.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        record.cached_tokens = int(details.get("cached_tokens") or 0)
