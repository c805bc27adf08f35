"""A backend that costs (almost) nothing: the yardstick for the proxy's own overhead.

Answers a chat completion at once with a fixed small body, or, when ``stream`` is true,
with ``--chunks`` SSE events written as fast as the socket takes them. Also serves what
routers probe: /health, /v1/models, /metrics (vLLM names), /server_info, /model_info.

    python -m loadtests.zero_backend --port 9000 --chunks 64
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

from loadtests.fleet import free_port, wait_http_ok_sync

MODEL = "zero-model"
Handler = Callable[[web.Request], Awaitable[web.Response]]
COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-zero",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }
)
CHUNK = (
    b'data: {"id":"chatcmpl-zero","object":"chat.completion.chunk","created":0,"model":"'
    + MODEL.encode()
    + b'","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
)
METRICS = (
    b'vllm:num_requests_running{engine="0",model_name="zero-model"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0",model_name="zero-model"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="zero-model"} 0.0\n'
)


def build_app(chunks: int) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if not body.get("stream"):
            return web.Response(body=COMPLETION, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(CHUNK)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def fixed(body: bytes, content_type: str = "application/json") -> Handler:
        async def handle(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type=content_type)

        return handle

    models = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
    info = orjson.dumps({"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", fixed(b"{}"))
    app.router.add_get("/v1/models", fixed(models))
    app.router.add_get("/metrics", fixed(METRICS, "text/plain"))
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        app.router.add_get(path, fixed(info))
    return app


class ZeroBackend:
    """``with ZeroBackend(chunks=64) as url:`` runs one in its own process on a free port."""

    def __init__(self, chunks: int = 64) -> None:
        self.chunks = chunks
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        repo = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loadtests.zero_backend", "--port", str(self.port),
             "--chunks", str(self.chunks)],
            cwd=repo,
            env={**os.environ, "PYTHONPATH": str(repo)},
        )  # fmt: skip
        try:
            wait_http_ok_sync(self.url + "/health", 15.0, alive=lambda: self.proc.poll() is None)
        except (TimeoutError, RuntimeError):
            self.__exit__()
            raise
        return self.url

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chunks", type=int, default=64)
    args = p.parse_args()
    uvloop.install()
    web.run_app(
        build_app(args.chunks), host="127.0.0.1", port=args.port, access_log=None, print=None
    )


if __name__ == "__main__":
    main()
