"""Entry point: ``python -m loadtests.simulator --port P [--dialect vllm|sglang|llamacpp] ...``."""

from __future__ import annotations

import asyncio
import signal

import uvloop
from aiohttp import web

from loadtests.simulator.config import SimConfig, parse_args
from loadtests.simulator.server import build_app


async def serve(cfg: SimConfig) -> None:
    """Serve until SIGTERM or SIGINT. Client disconnects cancel handlers (counted as aborts)."""
    runner = web.AppRunner(build_app(cfg), handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, cfg.host, cfg.port).start()
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    uvloop.run(serve(parse_args()))


if __name__ == "__main__":
    main()
