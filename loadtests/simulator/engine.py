"""Continuous batching with a timing model: a FIFO waiting queue, a bounded running batch.

Each scheduler step admits waiting sequences up to ``max_running`` (looking up their cached
prefix at admission, as vLLM does), then sleeps for the step's model time: prefill of the
newly admitted sequences' uncached tokens plus one decode step whose cost grows with the
batch. Admitted sequences get their first token at the end of the step, running ones one
more. When a step would be shorter than ``MIN_TICK_S`` of real time (large ``speedup``),
several decode steps are taken in one sleep so the simulator stays cheap in CPU.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field

from loadtests.simulator.cache import PrefixCache, lookup_limit
from loadtests.simulator.config import SimConfig
from loadtests.simulator.prompt import ROOT_HASH, block_chars, chain_hashes
from loadtests.simulator.stats import RequestRecord, Stats

MIN_TICK_S = 0.002
FILLER_VOCAB = 100


def filler_token(seed: int, index: int) -> str:
    """A 4-character token (" w07"), so generated text re-estimates to its token count."""
    return f" w{(seed + index) % FILLER_VOCAB:02d}"


@dataclass(eq=False, slots=True)
class Sequence:
    """One generation request inside the engine."""

    request_id: str
    endpoint: str
    prompt_text: str
    prompt_tokens: int
    block_hashes: list[int]
    max_tokens: int
    seed: int
    headers: dict[str, str | None]
    arrived: float = field(default_factory=time.monotonic)
    arrived_unix: float = field(default_factory=time.time)
    out: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    cached_tokens: int = 0
    generated: list[str] = field(default_factory=list)
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    slot: int = -1

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.generated)

    @property
    def text(self) -> str:
        return "".join(self.generated)


@dataclass(slots=True)
class SlotState:
    """What llama.cpp's /slots shows about a slot: its current or last task."""

    task: int = -1
    seq: Sequence | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    decoded: int = 0
    max_tokens: int = 0


class Engine:
    def __init__(self, cfg: SimConfig, cache: PrefixCache, stats: Stats) -> None:
        self.cfg = cfg
        self.cache = cache
        self.stats = stats
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.slots = [SlotState() for _ in range(cfg.max_running)]
        self._wake = asyncio.Event()
        self._task_counter = 0

    @property
    def used_tokens(self) -> int:
        return sum(s.prompt_tokens + len(s.generated) for s in self.running)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.used_tokens / self.cfg.capacity_tokens)

    def submit(self, seq: Sequence) -> None:
        self.stats.totals.requests += 1
        self.waiting.append(seq)
        self._wake.set()

    def cancel(self, seq: Sequence, reason: str) -> None:
        """Drop a sequence whose client left ("abort") or whose answer failed ("error")."""
        if seq.finish_reason is not None:
            return
        if reason == "abort":
            self.stats.totals.aborts += 1
        if seq in self.running:
            self._finish(seq, reason)
        else:
            seq.finish_reason = reason
            if seq in self.waiting:
                self.waiting.remove(seq)

    async def run(self) -> None:
        """The scheduler loop; runs until cancelled."""
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            decoding = [s for s in self.running if s not in admitted]
            prefill_ms = sum(s.prompt_tokens - s.cached_tokens for s in admitted) * (
                self.cfg.prefill_ms_per_1k_tokens / 1000
            )
            steps = self._decode_steps(decoding, prefill_ms) if decoding else 0
            decode_ms = steps * self._decode_step_ms()
            await asyncio.sleep((prefill_ms + decode_ms) / 1000 / self.cfg.speedup)
            self._account_step(prefill_ms, decode_ms, max(steps, 1))
            now = time.monotonic()
            for seq in admitted:
                if seq.finish_reason is None:
                    self.cache.insert(seq.block_hashes)
                    seq.first_token_at = now
                    self._emit(seq, 1)
            for seq in decoding:
                if seq.finish_reason is None:
                    self._emit(seq, steps)

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        limit_blocks = self.cfg.block_tokens
        while self.waiting and len(self.running) < self.cfg.max_running:
            seq = self.waiting.popleft()
            limit = lookup_limit(seq.prompt_tokens, limit_blocks)
            seq.cached_tokens = self.cache.match(seq.block_hashes, limit) * limit_blocks
            seq.admitted_at = time.monotonic()
            seq.slot = next(i for i, s in enumerate(self.slots) if s.seq is None)
            self._task_counter += 1
            self.slots[seq.slot] = SlotState(
                task=self._task_counter,
                seq=seq,
                prompt_tokens=seq.prompt_tokens,
                cached_tokens=seq.cached_tokens,
                max_tokens=seq.max_tokens,
            )
            totals = self.stats.totals
            totals.prompt_tokens += seq.prompt_tokens
            totals.cached_tokens += seq.cached_tokens
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _decode_step_ms(self) -> float:
        return self.cfg.decode_ms_per_token + self.cfg.decode_ms_per_seq * len(self.running)

    def _decode_steps(self, decoding: list[Sequence], prefill_ms: float) -> int:
        """One step, or several when a single step is shorter than a real-time tick."""
        step_s = self._decode_step_ms() / 1000 / self.cfg.speedup
        budget_s = MIN_TICK_S - prefill_ms / 1000 / self.cfg.speedup
        if step_s <= 0:
            steps = min(s.remaining for s in decoding)
        else:
            steps = max(1, math.ceil(budget_s / step_s))
        return max(1, min(steps, *(s.remaining for s in decoding)))

    def _account_step(self, prefill_ms: float, decode_ms: float, steps: int) -> None:
        stats = self.stats
        stats.decode_steps += steps
        stats.busy_slot_steps += steps * len(self.running)
        stats.prompt_seconds += prefill_ms / 1000
        stats.decode_seconds += decode_ms / 1000

    def _emit(self, seq: Sequence, count: int) -> None:
        n = min(count, seq.remaining)
        start = len(seq.generated)
        for i in range(start, start + n):
            token = filler_token(seq.seed, i)
            seq.generated.append(token)
            seq.out.put_nowait(token)
        self.stats.totals.generation_tokens += n
        self.slots[seq.slot].decoded = len(seq.generated)
        if seq.remaining <= 0:
            self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str) -> None:
        now = time.monotonic()
        seq.finish_reason = reason
        seq.finished_at = now
        self.running.remove(seq)
        self.slots[seq.slot].seq = None
        output_hashes: list[int] = []
        if reason == "length":
            self.stats.totals.finished += 1
            if self.cfg.cache_generated:
                output_hashes = self._output_hashes(seq)
                self.cache.insert(seq.block_hashes + output_hashes)
        seq.out.put_nowait(None)
        admitted = seq.admitted_at if seq.admitted_at is not None else now
        self.stats.max_seq_tokens = max(
            self.stats.max_seq_tokens, seq.prompt_tokens + len(seq.generated)
        )
        self.stats.add_record(
            RequestRecord(
                seq=self.slots[seq.slot].task,
                id=seq.request_id,
                endpoint=seq.endpoint,
                arrival_unix=seq.arrived_unix,
                prompt_tokens=seq.prompt_tokens,
                cached_tokens=seq.cached_tokens,
                completion_tokens=len(seq.generated),
                queue_wait_s=admitted - seq.arrived,
                ttft_s=None if seq.first_token_at is None else seq.first_token_at - seq.arrived,
                e2e_s=now - seq.arrived,
                finish_reason=reason,
                x_request_id=seq.headers.get("x-request-id"),
                traceparent=seq.headers.get("traceparent"),
                x_session_id=seq.headers.get("x-session-id"),
                authorization=seq.headers.get("authorization"),
                block_hashes=seq.block_hashes,
                output_block_hashes=output_hashes,
            )
        )

    def _output_hashes(self, seq: Sequence) -> list[int]:
        """Blocks completed by the generated text, chained after the prompt's full blocks."""
        size = block_chars(self.cfg.block_tokens)
        done = len(seq.block_hashes) * size
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
        return chain_hashes(seq.prompt_text[done:] + seq.text, size, parent)

    def clear_slots(self) -> None:
        """Forget finished slots' last tasks (on reset); running ones keep theirs."""
        for i, slot in enumerate(self.slots):
            if slot.seq is None:
                self.slots[i] = SlotState()
