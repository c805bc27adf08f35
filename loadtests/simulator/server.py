"""The simulator's HTTP face: OpenAI/Anthropic endpoints, engine info, /sim control."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from loadtests.simulator.cache import PrefixCache
from loadtests.simulator.config import SimConfig
from loadtests.simulator.engine import Engine, Sequence
from loadtests.simulator.metrics import MetricsView
from loadtests.simulator.parse import (
    GenRequest,
    parse_chat,
    parse_completion,
    parse_messages,
    parse_responses,
)
from loadtests.simulator.prompt import (
    ChatRenderer,
    PromptError,
    block_chars,
    chain_hashes,
    estimate_tokens,
    text_seed,
)
from loadtests.simulator.stats import Stats
from loadtests.simulator.wire import (
    ChatWire,
    CompletionWire,
    MessagesWire,
    ReplyMeta,
    ResponsesWire,
    Usage,
    Wire,
)

TRACKED_HEADERS = ("x-request-id", "traceparent", "x-session-id", "authorization")
EMBEDDING_DIM = 8
GARBAGE_METRICS = "vllm:num_requests_running{{{ not prometheus\n\x00garbage 1 2 3\n"

Parser = Callable[[Any, ChatRenderer, int], GenRequest]


class Simulator:
    """State of one replica, shared by the handlers."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.initial_faults = copy.deepcopy(cfg.faults)
        self.faults = cfg.faults
        self.renderer = ChatRenderer.from_file(cfg.chat_template)
        self.cache = PrefixCache(cfg.capacity_tokens // cfg.block_tokens)
        self.stats = Stats(max_records=cfg.max_records)
        self.engine = Engine(cfg, self.cache, self.stats)
        self.metrics = MetricsView(cfg, self.engine, self.stats)
        self.started = int(time.time())

    def reset(self) -> None:
        """Clear stats and cache and restore the start-up fault knobs."""
        self.stats = Stats(max_records=self.cfg.max_records)
        self.engine.stats = self.stats
        self.metrics = MetricsView(self.cfg, self.engine, self.stats)
        self.cache.clear()
        self.engine.clear_slots()
        self.faults = copy.deepcopy(self.initial_faults)


def build_app(cfg: SimConfig) -> web.Application:
    sim = Simulator(cfg)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["sim"] = sim
    gen = {
        "/v1/chat/completions": (_chat_parser, ChatWire(), "chatcmpl-"),
        "/v1/completions": (_completion_parser, CompletionWire(), "cmpl-"),
        "/v1/responses": (parse_responses, ResponsesWire(), ""),
        "/v1/messages": (parse_messages, MessagesWire(), ""),
    }
    for path, (parser, wire, prefix) in gen.items():
        app.router.add_post(path, _generation_handler(sim, path, parser, wire, prefix))
    app.router.add_post("/v1/embeddings", _embeddings_handler(sim))
    app.router.add_get("/v1/models", _models_handler(sim))
    app.router.add_get("/health", _health_handler(sim))
    app.router.add_get("/metrics", _metrics_handler(sim))
    app.router.add_get("/sim/stats", _stats_handler(sim))
    app.router.add_post("/sim/reset", _reset_handler(sim))
    app.router.add_get("/sim/config", _config_handler(sim))
    app.router.add_post("/sim/config", _config_handler(sim))
    if cfg.dialect == "llamacpp":
        app.router.add_get("/slots", _slots_handler(sim))
        app.router.add_get("/props", _props_handler(sim))
    if cfg.dialect == "sglang":
        app.router.add_get("/get_model_info", _sglang_model_info(sim))
        app.router.add_get("/model_info", _sglang_model_info(sim))
        app.router.add_get("/get_server_info", _sglang_server_info(sim))
        app.router.add_get("/server_info", _sglang_server_info(sim))

    async def start_engine(app: web.Application) -> None:
        app["engine_task"] = asyncio.create_task(sim.engine.run())
        app["engine_task"].add_done_callback(_exit_if_crashed)

    async def stop_engine(app: web.Application) -> None:
        app["engine_task"].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await app["engine_task"]

    app.on_startup.append(start_engine)
    app.on_cleanup.append(stop_engine)
    return app


def _exit_if_crashed(task: asyncio.Task[None]) -> None:
    """A dead scheduler would hang every request: log why and stop the process instead."""
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger(__name__).critical("scheduler crashed", exc_info=task.exception())
        os.kill(os.getpid(), signal.SIGTERM)


def _chat_parser(body: Any, renderer: ChatRenderer, default_max: int) -> GenRequest:
    return parse_chat(body, renderer, default_max)


def _completion_parser(body: Any, renderer: ChatRenderer, default_max: int) -> GenRequest:
    return parse_completion(body, default_max)


def error_response(dialect: str, status: int, message: str) -> web.Response:
    """An error body in the engine's shape."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(
        status, "InternalServerError"
    )
    if dialect == "llamacpp":
        body: dict[str, Any] = {
            "error": {"code": status, "message": message, "type": "invalid_request_error"}
        }
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return _json(body, status)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise PromptError(f"invalid JSON body: {e}") from e


def _generation_handler(
    sim: Simulator, path: str, parser: Parser, wire: Wire, prefix: str
) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        cfg, faults = sim.cfg, sim.faults
        try:
            gen = parser(await _read_json(request), sim.renderer, cfg.default_max_tokens)
        except PromptError as e:
            sim.stats.totals.rejected += 1
            return error_response(cfg.dialect, 400, str(e))
        if gen.model is not None and gen.model != cfg.model and cfg.dialect != "llamacpp":
            sim.stats.totals.rejected += 1
            return error_response(cfg.dialect, 404, f"The model `{gen.model}` does not exist.")
        prompt_tokens = estimate_tokens(gen.prompt_text)
        if prompt_tokens + gen.max_tokens > cfg.max_model_len:
            sim.stats.totals.rejected += 1
            return error_response(
                cfg.dialect,
                400,
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {prompt_tokens + gen.max_tokens} tokens.",
            )
        if faults.fail_next > 0:
            faults.fail_next -= 1
            sim.stats.totals.errors += 1
            return error_response(cfg.dialect, faults.fail_status, "simulated failure")
        if faults.hang:
            await asyncio.Event().wait()
        seq = Sequence(
            request_id=uuid.uuid4().hex,
            endpoint=path,
            prompt_text=gen.prompt_text,
            prompt_tokens=prompt_tokens,
            block_hashes=chain_hashes(gen.prompt_text, block_chars(cfg.block_tokens)),
            max_tokens=gen.max_tokens,
            seed=text_seed(gen.prompt_text),
            headers={h: request.headers.get(h) for h in TRACKED_HEADERS},
        )
        meta = ReplyMeta(
            id=prefix + seq.request_id,
            created=int(time.time()),
            model=cfg.model,
            dialect=cfg.dialect,
        )
        sim.engine.submit(seq)
        try:
            if gen.stream:
                return await _stream(request, sim, seq, meta, wire, gen.include_usage)
            return await _complete(request, sim, seq, meta, wire)
        finally:
            sim.engine.cancel(seq, "abort")

    return handle


async def _stream(
    request: web.Request,
    sim: Simulator,
    seq: Sequence,
    meta: ReplyMeta,
    wire: Wire,
    include_usage: bool,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    sent = 0

    async def send(chunks: list[bytes]) -> bool:
        """Write chunks, applying the stream faults; False once the connection is dropped."""
        nonlocal sent
        for chunk in chunks:
            die_after = sim.faults.die_after_chunks
            if die_after is not None and sent >= die_after:
                _die(request, sim, seq)
                return False
            if sim.faults.chunk_delay_s:
                await asyncio.sleep(sim.faults.chunk_delay_s)
            await resp.write(chunk)
            sent += 1
        return True

    try:
        head = True
        while (token := await seq.out.get()) is not None:
            chunks = wire.head(meta, _usage(seq)) if head else []
            head = False
            chunks.append(wire.token(meta, token))
            if not await send(chunks):
                return resp
        if await send(wire.tail(meta, seq.text, _usage(seq), include_usage)):
            await resp.write_eof()
    except ConnectionResetError:
        pass
    return resp


async def _complete(
    request: web.Request, sim: Simulator, seq: Sequence, meta: ReplyMeta, wire: Wire
) -> web.StreamResponse:
    while await seq.out.get() is not None:
        pass
    if sim.faults.die_after_chunks is not None:
        _die(request, sim, seq)
        return web.StreamResponse()
    return _json(wire.body(meta, seq.text, _usage(seq)))


def _die(request: web.Request, sim: Simulator, seq: Sequence) -> None:
    """Close the socket abruptly, as a crashing engine would; counted as an error."""
    sim.stats.totals.errors += 1
    sim.engine.cancel(seq, "error")
    if request.transport is not None:
        request.transport.abort()


def _usage(seq: Sequence) -> Usage:
    admitted = seq.admitted_at or seq.arrived
    first = seq.first_token_at or admitted
    end = seq.finished_at or first
    return Usage(
        prompt_tokens=seq.prompt_tokens,
        completion_tokens=len(seq.generated),
        cached_tokens=seq.cached_tokens,
        prompt_ms=(first - admitted) * 1000,
        predicted_ms=(end - first) * 1000,
    )


def _embeddings_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        try:
            body = await _read_json(request)
            given = body.get("input") if isinstance(body, dict) else None
            texts = [given] if isinstance(given, str) else given
            if (
                not isinstance(texts, list)
                or not texts
                or not all(isinstance(t, str) for t in texts)
            ):
                raise PromptError("'input' must be a string or a non-empty list of strings")
        except PromptError as e:
            sim.stats.totals.rejected += 1
            return error_response(sim.cfg.dialect, 400, str(e))
        sim.stats.totals.embeddings += 1
        data = [
            {"object": "embedding", "index": i, "embedding": _embedding(text)}
            for i, text in enumerate(texts)
        ]
        tokens = sum(estimate_tokens(t) for t in texts)
        return _json(
            {
                "object": "list",
                "data": data,
                "model": sim.cfg.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    return handle


def _embedding(text: str) -> list[float]:
    """A small deterministic unit-ish vector derived from the text's hash."""
    seed = text_seed(text)
    return [((seed >> (8 * i)) & 0xFF) / 255.0 - 0.5 for i in range(EMBEDDING_DIM)]


def _models_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        cfg = sim.cfg
        model: dict[str, Any] = {"id": cfg.model, "object": "model", "created": sim.started}
        if cfg.dialect == "llamacpp":
            meta = {
                "n_ctx": cfg.capacity_tokens // cfg.max_running,
                "n_ctx_train": cfg.max_model_len,
            }
            entry = {
                **model,
                "aliases": [cfg.model],
                "tags": [],
                "owned_by": "llamacpp",
                "meta": meta,
            }
            listed = {
                "name": cfg.model,
                "model": cfg.model,
                "type": "model",
                "capabilities": ["completion"],
            }
            return _json({"models": [listed], "object": "list", "data": [entry]})
        entry = {
            **model,
            "owned_by": cfg.dialect,
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [],
        }
        return _json({"object": "list", "data": [entry]})

    return handle


def _health_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        status = sim.faults.health_status
        if sim.cfg.dialect == "llamacpp":
            if status == 200:
                return _json({"status": "ok"})
            return error_response("llamacpp", status, "Loading model")
        return web.Response(status=status)

    return handle


def _metrics_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        if sim.faults.metrics_delay_s:
            await asyncio.sleep(sim.faults.metrics_delay_s)
        text = GARBAGE_METRICS if sim.faults.metrics_garbage else sim.metrics.render()
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    return handle


def _stats_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        records = request.query.get("records", "1") != "0"
        hashes = request.query.get("hashes", "1") != "0"
        body = {
            "dialect": sim.cfg.dialect,
            "model": sim.cfg.model,
            "block_tokens": sim.cfg.block_tokens,
            "running": len(sim.engine.running),
            "waiting": len(sim.engine.waiting),
            "cached_blocks": len(sim.cache),
            "evicted_blocks": sim.cache.evictions,
            **sim.stats.to_json(records=records, hashes=hashes),
        }
        return _json(body)

    return handle


def _reset_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        sim.reset()
        return _json({"reset": True})

    return handle


def _config_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        if request.method == "POST":
            try:
                changes = await _read_json(request)
                if not isinstance(changes, dict):
                    raise PromptError("the body must be a JSON object of fault knobs")
                sim.faults.update(changes)
            except ValueError as e:
                return _json({"error": str(e)}, 400)
        return _json(sim.faults.as_dict())

    return handle


def _slots_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        cfg = sim.cfg
        n_ctx = cfg.capacity_tokens // cfg.max_running
        slots = []
        for i, slot in enumerate(sim.engine.slots):
            busy = slot.seq is not None
            slots.append(
                {
                    "id": i,
                    "n_ctx": n_ctx,
                    "speculative": False,
                    "is_processing": busy,
                    "id_task": slot.task,
                    "n_prompt_tokens": slot.prompt_tokens,
                    "n_prompt_tokens_processed": slot.prompt_tokens - slot.cached_tokens,
                    "n_prompt_tokens_cache": slot.cached_tokens,
                    "params": {"max_tokens": slot.max_tokens, "n_predict": slot.max_tokens},
                    "next_token": [
                        {
                            "has_next_token": busy,
                            "has_new_line": False,
                            "n_remain": slot.max_tokens - slot.decoded if busy else -1,
                            "n_decoded": slot.decoded,
                        }
                    ],
                }
            )
        return _json(slots)

    return handle


def _props_handler(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        cfg = sim.cfg
        n_ctx = cfg.capacity_tokens // cfg.max_running
        return _json(
            {
                "default_generation_settings": {
                    "params": {"max_tokens": -1, "n_predict": -1},
                    "n_ctx": n_ctx,
                },
                "total_slots": cfg.max_running,
                "model_alias": cfg.model,
                "model_path": f"models/{cfg.model}.gguf",
                "modalities": {"vision": False, "video": False, "audio": False},
                "endpoint_slots": True,
                "endpoint_props": False,
                "endpoint_metrics": True,
                "chat_template": sim.renderer.source,
                "bos_token": "",
                "eos_token": "<|im_end|>",
                "build_info": "b1-sim",
                "is_sleeping": False,
            }
        )

    return handle


def _sglang_model_info(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        return _json(
            {"model_path": sim.cfg.model, "tokenizer_path": sim.cfg.model, "is_generation": True}
        )

    return handle


def _sglang_server_info(sim: Simulator) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        cfg = sim.cfg
        return _json(
            {
                "model_path": cfg.model,
                "served_model_name": cfg.model,
                "max_total_num_tokens": cfg.capacity_tokens,
                "max_running_requests": cfg.max_running,
                "page_size": cfg.block_tokens,
                "context_length": cfg.max_model_len,
            }
        )

    return handle
