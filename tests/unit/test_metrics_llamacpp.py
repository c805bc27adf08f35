"""llama.cpp /props and /slots give the KV picture its /metrics lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.backends.llamacpp import LlamaProps, LlamaSlots, parse_props, parse_slots, with_slot_load
from proxy.backends.metrics import parse_metrics

LLAMA_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "engines"
LLAMA_DIR = LLAMA_DIR / "llama-server-lcp0.3.36"
needs_fixtures = pytest.mark.skipif(not LLAMA_DIR.is_dir(), reason="shared/fixtures not present")


def body(name: str) -> str:
    """The fixture's response body, without the capture's trailing status line."""
    return (LLAMA_DIR / name).read_text().rsplit("\nHTTP ", 1)[0]


def slot(
    ctx: int = 1024, busy: bool = False, prompt: int | None = None, decoded: int | None = None
) -> dict[str, object]:
    """One /slots entry shaped like the real build's."""
    entry: dict[str, object] = {"id": 0, "n_ctx": ctx, "speculative": False, "is_processing": busy}
    if prompt is not None:
        entry |= {"id_task": 7, "n_prompt_tokens": prompt, "n_prompt_tokens_cache": 0}
        entry["next_token"] = [{"has_next_token": busy, "n_remain": -1, "n_decoded": decoded or 0}]
    return entry


@needs_fixtures
def test_props_fixture() -> None:
    props, reason = parse_props(body("props.json"))
    assert reason is None
    assert props is not None
    assert (props.total_slots, props.slot_ctx, props.kv_capacity_tokens) == (4, 1024, 4096)
    assert props.bos_token == "<|endoftext|>"
    assert props.eos_token == "<|im_end|>"
    assert props.model_alias == "tiny-llama"
    assert props.chat_template is not None
    assert props.chat_template.startswith("{% for message in messages %}{{'<|im_start|>'")


@needs_fixtures
def test_idle_slots_fixture() -> None:
    slots, reason = parse_slots(body("slots.json"))
    assert reason is None
    assert slots == LlamaSlots(
        total=4, processing=0, capacity_tokens=4096, active_tokens=0, retained_tokens=4 * 213
    )
    assert slots.kv_usage == 0.0


def test_busy_slots_count_prompt_and_decoded_tokens() -> None:
    doc = [
        slot(busy=True, prompt=300, decoded=20),
        slot(busy=True, prompt=1000, decoded=100),  # capped at the slot's 1024
        slot(busy=False, prompt=500),
        slot(),
    ]
    slots, _ = parse_slots(json.dumps(doc))
    assert slots is not None
    assert (slots.processing, slots.active_tokens, slots.retained_tokens) == (2, 1344, 1844)
    assert slots.kv_usage == pytest.approx(1344 / 4096)


def test_builds_without_token_counts_fall_back_to_busy_share() -> None:
    slots, _ = parse_slots(json.dumps([slot(busy=True), slot(), slot(), slot()]))
    assert slots is not None
    assert slots.active_tokens is None
    assert slots.kv_usage == 0.25


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "slots_not_list"),
        ("not json", "slots_not_list"),
        (
            '{"error": {"code": 501, "message": "This server does not support slots"}}',
            "slots_not_list",
        ),
        ("[]", "slots_empty"),
        ("[1, null, []]", "slots_empty"),
    ],
)
def test_unusable_slots(text: str, reason: str) -> None:
    assert parse_slots(text) == (None, reason)


@pytest.mark.parametrize(
    ("text", "reason"),
    [("[1]", "props_not_object"), ("{}", "props_empty"), ("\x00", "props_not_object")],
)
def test_unusable_props(text: str, reason: str) -> None:
    assert parse_props(text) == (None, reason)


def test_props_ignore_wrongly_typed_fields() -> None:
    props, _ = parse_props(
        json.dumps({"total_slots": True, "chat_template": 3, "eos_token": "</s>"})
    )
    assert props == LlamaProps(eos_token="</s>")


@needs_fixtures
def test_metrics_completed_from_slots_and_props() -> None:
    engine = parse_metrics(body("metrics_during_load.txt"), now=5.0).engine
    assert engine is not None
    props, _ = parse_props(body("props.json"))
    busy, _ = parse_slots(json.dumps([slot(busy=True, prompt=512), slot(), slot(), slot()]))
    merged = with_slot_load(engine, props, busy)
    assert (merged.kv_usage, merged.kv_capacity_tokens) == (0.125, 4096)
    assert (merged.cache_hit_tokens, merged.cache_query_tokens) == (16.0, 129.0)

    no_slots = with_slot_load(engine, props, None)
    assert (no_slots.kv_usage, no_slots.kv_capacity_tokens) == (None, 4096)
    assert with_slot_load(engine, None, None) == engine
