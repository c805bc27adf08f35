"""llama.cpp's /props and /slots: the KV picture its /metrics lacks. Pure; never raises.

KV capacity is slots x per-slot context (``/props`` ``total_slots`` and
``default_generation_settings.n_ctx``, or the sum of ``/slots`` ``n_ctx``).

KV usage is the share of that capacity held by requests being processed now: for each
busy slot its prompt plus the tokens decoded so far (``n_prompt_tokens`` +
``next_token[0].n_decoded``), capped at the slot's context. Idle slots keep their last
conversation for prefix reuse, but that memory is given up on demand, the same way
vLLM counts cached-but-free blocks as free; those tokens are reported separately as
``retained_tokens``. Builds whose slots carry no token counts fall back to busy slots
/ all slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from proxy.backends.load import LoadSnapshot


@dataclass(frozen=True, slots=True)
class LlamaProps:
    """What /props tells about the server; any field may be missing."""

    total_slots: int | None = None
    slot_ctx: int | None = None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    model_alias: str | None = None

    @property
    def kv_capacity_tokens(self) -> int | None:
        if self.total_slots is None or self.slot_ctx is None:
            return None
        return self.total_slots * self.slot_ctx


@dataclass(frozen=True, slots=True)
class LlamaSlots:
    """What /slots tells about KV use right now."""

    total: int
    processing: int
    capacity_tokens: int | None
    active_tokens: int | None
    retained_tokens: int | None

    @property
    def kv_usage(self) -> float | None:
        if self.active_tokens is not None and self.capacity_tokens:
            return min(self.active_tokens / self.capacity_tokens, 1.0)
        if self.total:
            return self.processing / self.total
        return None


def parse_props(body: str | bytes) -> tuple[LlamaProps | None, str | None]:
    """Parse a /props body into (props, None) or (None, reason)."""
    doc = _load(body)
    if not isinstance(doc, dict):
        return None, "props_not_object"
    settings = doc.get("default_generation_settings")
    settings = settings if isinstance(settings, dict) else {}
    props = LlamaProps(
        total_slots=_positive_int(doc.get("total_slots")),
        slot_ctx=_positive_int(settings.get("n_ctx")),
        chat_template=_text(doc.get("chat_template")),
        bos_token=_text(doc.get("bos_token")),
        eos_token=_text(doc.get("eos_token")),
        model_alias=_text(doc.get("model_alias")),
    )
    if props == LlamaProps():
        return None, "props_empty"
    return props, None


def parse_slots(body: str | bytes) -> tuple[LlamaSlots | None, str | None]:
    """Parse a /slots body into (slots, None) or (None, reason)."""
    doc = _load(body)
    if not isinstance(doc, list):
        return None, "slots_not_list"
    slots = [s for s in doc if isinstance(s, dict)]
    if not slots:
        return None, "slots_empty"
    contexts = [_positive_int(s.get("n_ctx")) for s in slots]
    held = [_held_tokens(s, ctx) for s, ctx in zip(slots, contexts, strict=True)]
    busy = [s.get("is_processing") is True for s in slots]
    known_ctx = [c for c in contexts if c is not None]
    busy_held = [h for h, b in zip(held, busy, strict=True) if b]
    busy_known = [h for h in busy_held if h is not None]
    all_known = [h for h in held if h is not None]
    loads = LlamaSlots(
        total=len(slots),
        processing=sum(busy),
        capacity_tokens=sum(known_ctx) if len(known_ctx) == len(slots) else None,
        active_tokens=sum(busy_known) if len(busy_known) == len(busy_held) else None,
        retained_tokens=sum(all_known) if all_known else None,
    )
    return loads, None


def with_slot_load(
    snapshot: LoadSnapshot, props: LlamaProps | None, slots: LlamaSlots | None
) -> LoadSnapshot:
    """The /metrics snapshot completed with KV usage and capacity from /slots and /props."""
    capacity = slots.capacity_tokens if slots else None
    if capacity is None and props is not None:
        capacity = props.kv_capacity_tokens
    return dataclasses.replace(
        snapshot,
        kv_usage=slots.kv_usage if slots else snapshot.kv_usage,
        kv_capacity_tokens=capacity if capacity is not None else snapshot.kv_capacity_tokens,
    )


def _held_tokens(slot: Mapping[str, object], ctx: int | None) -> int | None:
    """Tokens in this slot's KV: its prompt plus what it decoded, at most its context."""
    prompt = _count(slot.get("n_prompt_tokens"))
    if prompt is None:
        return None
    nxt = slot.get("next_token")
    if isinstance(nxt, list):
        nxt = nxt[0] if nxt else None
    decoded = _count(nxt.get("n_decoded")) if isinstance(nxt, dict) else None
    held = prompt + (decoded or 0)
    return min(held, ctx) if ctx else held


def _load(body: str | bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _count(value: object) -> int | None:
    """A non-negative integer from JSON, rejecting bools, floats and garbage."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _positive_int(value: object) -> int | None:
    count = _count(value)
    return count if count else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
