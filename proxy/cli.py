"""Command line: ``prefix-proxy serve | check-config | demo``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web

from proxy.app import ProxyApp
from proxy.config import ConfigError, LoadedConfig, load_config
from proxy.connection_guard import HeaderDeadline

log = logging.getLogger("prefix_proxy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prefix-proxy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config file (hot-reloaded on change and SIGHUP)")
    serve.add_argument("--backend", action="append", default=[], help="backend URL (repeatable)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8000)")
    serve.add_argument("--policy", help="policy preset name or policy YAML file")
    serve.add_argument("--workers", type=int, help="worker processes sharing the port")
    serve.add_argument("--log-level", default="INFO")

    check = sub.add_parser("check-config", help="validate a config or policy file")
    check.add_argument("file")

    demo = sub.add_parser("demo", help="simulated fleet: round-robin vs prefix-aware routing")
    demo.add_argument("--replicas", type=int, default=4)
    demo.add_argument("--sessions", type=int, default=40)
    demo.add_argument("--turns", type=int, default=8)
    demo.add_argument("--seconds", type=float, default=90.0, help="hard time limit")
    demo.add_argument("--charts", help="also write PNG charts here (needs matplotlib)")

    args = parser.parse_args(argv)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "check-config":
        return cmd_check_config(args.file)
    from loadtests.demo import run_demo

    return run_demo(args)


def cmd_check_config(file: str) -> int:
    """Validate a full config file, or a policy file (one with ``scorers`` at the top)."""
    import yaml

    from proxy.config import load_yaml, resolve_policy

    try:
        data, _ = load_yaml(Path(file).read_text(), file)
        if isinstance(data, dict) and "scorers" in data:
            policy = resolve_policy(file, None)
            print(f"ok: policy {policy.name!r} ({len(policy.scorers)} scorers)")
        else:
            loaded = load_config(file)
            print(f"ok: config with policy {loaded.policy.name!r}")
        return 0
    except (ConfigError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {file}: {e.strerror}", file=sys.stderr)
        return 2


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    overrides: dict[str, Any] = {}
    if args.backend:
        overrides["backends.static"] = args.backend
    if args.host:
        overrides["listen.host"] = args.host
    if args.port is not None:
        overrides["listen.port"] = args.port
    if args.policy:
        overrides["policy"] = args.policy
    if args.workers is not None:
        overrides["listen.workers"] = args.workers
    try:
        loaded = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    workers = loaded.config.listen.workers
    if workers == 1:
        uvloop.run(serve(loaded))
        return 0
    return _run_workers(loaded, workers, args.log_level.upper())


async def serve(loaded: LoadedConfig, reuse_port: bool = False) -> None:
    """Run until SIGTERM/SIGINT, then drain in-flight requests within the deadline."""
    cfg = loaded.config
    proxy = ProxyApp(loaded)
    runner = web.AppRunner(
        proxy.web,
        handler_cancellation=True,
        shutdown_timeout=cfg.limits.drain_timeout_s,
        access_log=None,
        max_field_size=cfg.limits.max_header_bytes,
        max_line_size=cfg.limits.max_header_bytes,
        keepalive_timeout=cfg.limits.keepalive_timeout_s,
    )
    await runner.setup()
    handler_factory = runner.server
    assert handler_factory is not None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: HeaderDeadline(handler_factory(), cfg.limits.header_timeout_s),
        cfg.listen.host,
        cfg.listen.port,
        reuse_port=reuse_port,
        backlog=2048,
    )
    log.info(
        "prefix-proxy listening on %s:%d, policy %s, %d backends",
        cfg.listen.host,
        cfg.listen.port,
        proxy.runtime.policy.name,
        len(proxy.pool),
    )
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _reload_quietly, proxy)
    await stop.wait()
    log.info("shutting down: draining in-flight requests (up to %.0fs)", cfg.limits.drain_timeout_s)
    server.close()  # stop accepting; in-flight requests finish within the drain deadline
    await runner.cleanup()


def _reload_quietly(proxy: ProxyApp) -> None:
    with contextlib.suppress(ConfigError, OSError):  # reload() logs and counts the rejection
        proxy.reload()


def _worker(loaded: LoadedConfig, log_level: str) -> None:
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s %(message)s"
    )
    uvloop.run(serve(loaded, reuse_port=True))


def _run_workers(loaded: LoadedConfig, workers: int, log_level: str) -> int:
    """N processes on one port (SO_REUSEPORT); signals are passed on to each."""
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_worker, args=(loaded, log_level), daemon=False) for _ in range(workers)
    ]
    for p in procs:
        p.start()

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for p in procs:
        p.join()
    return max((p.exitcode or 0) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
