"""A deadline for a connection's first request head: slowloris clients are cut off.

aiohttp's server has no timeout for receiving request headers: a client that trickles a
byte a minute holds a connection (and its memory) forever. This thin protocol wrapper sits
between the event loop and aiohttp's request handler, forwards everything, and closes the
transport if no complete request head (``\\r\\n\\r\\n``) arrived within ``timeout_s`` of
connecting. Idle keep-alive connections are bounded separately by aiohttp's
``keepalive_timeout``; the body read has its own deadline in ``proxy.requests.read_body``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("prefix_proxy.server")


class HeaderDeadline(asyncio.Protocol):
    def __init__(self, inner: asyncio.Protocol, timeout_s: float, on_timeout: Any = None) -> None:
        self.inner = inner
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if b"\r\n\r\n" in seen:
                self._timer.cancel()
                self._timer = None
                self._tail = b""
            else:
                self._tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _expire(self) -> None:
        self._timer = None
        if self.on_timeout is not None:
            self.on_timeout()
        if self._transport is not None and not self._transport.is_closing():
            log.info("closing a connection that sent no request head within %.0fs", self.timeout_s)
            self._transport.close()
