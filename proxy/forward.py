"""Forward one request upstream and stream the answer back untouched.

Retries go to the next backend in the decision's ranking, and only before the first body
byte has reached the client: after that the bytes are the client's, and an upstream failure
ends the stream with an error event (SSE) or a cut connection (plain body), never a hang.
Bytes are written as they arrive (``iter_any``) and ``write`` waits for the client socket to
drain, so a slow client applies backpressure upstream instead of growing a buffer here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.backends.pool import Backend, BackendPool
from proxy.config import UpstreamConfig
from proxy.errors import ProxyError, error_body
from proxy.telemetry.metrics import ProxyMetrics
from proxy.telemetry.tracing import NO_TRACE, RequestTrace

log = logging.getLogger("prefix_proxy.forward")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
MAX_ERROR_BODY = 64 * 1024


@dataclass(slots=True)
class ForwardResult:
    """What happened, for the record step (metrics, index, access log, trace)."""

    backend: Backend | None = None
    status: int = 0
    attempts: int = 0
    first_byte_at: float | None = None
    error_kind: str | None = None
    client_aborted: bool = False
    retries: list[str] = field(default_factory=list)
    stale_retry: str | None = None
    trace: RequestTrace = NO_TRACE


class Forwarder:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        pool: BackendPool,
        metrics: ProxyMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.pool = pool
        self.metrics = metrics
        self.clock = clock

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        ranked: list[str],
        cfg: UpstreamConfig,
        headers: Mapping[str, str],
        on_commit: Callable[[Backend], None],
        response_headers: Mapping[str, str],
        result: ForwardResult,
    ) -> web.StreamResponse:
        """Try backends in order; ``on_commit`` runs once the first body byte is in hand."""
        last_error: ProxyError | None = None
        for url in ranked:
            if result.attempts >= cfg.max_attempts:
                break
            backend = self.pool.get(url)
            if backend is None or backend.draining:
                continue
            result.attempts += 1
            if result.attempts > 1:
                self.metrics.retries.labels(result.error_kind or "unknown").inc()
                result.retries.append(url)
            backend.inflight += 1
            try:
                outcome = await self._attempt(
                    request, body, backend, cfg, headers, on_commit, response_headers, result
                )
                if isinstance(outcome, StaleConnection) and result.attempts < cfg.max_attempts:
                    result.attempts += 1  # the same backend again, on a fresh connection
                    outcome = await self._attempt(
                        request, body, backend, cfg, headers, on_commit, response_headers, result
                    )
            finally:
                backend.inflight -= 1
            if isinstance(outcome, web.StreamResponse):
                return outcome
            last_error = outcome
        if last_error is None:
            raise ProxyError(503, "no healthy backend could take the request", "no_backend")
        raise last_error

    async def _attempt(
        self,
        request: web.Request,
        body: bytes,
        backend: Backend,
        cfg: UpstreamConfig,
        headers: Mapping[str, str],
        on_commit: Callable[[Backend], None],
        response_headers: Mapping[str, str],
        result: ForwardResult,
    ) -> web.StreamResponse | ProxyError:
        """One upstream try: a committed response, or the error to retry on."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s
        )
        url = backend.url + request.rel_url.raw_path_qs
        upstream: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(cfg.first_byte_timeout_s):
                upstream = await self.session.request(
                    request.method,
                    url,
                    data=body if body else None,
                    headers=result.trace.upstream_headers(headers, backend, request.method, url),
                    timeout=timeout,
                    allow_redirects=False,
                )
                if upstream.status >= 500:
                    detail = await upstream.content.read(MAX_ERROR_BODY)
                    upstream.release()
                    return self._failed(
                        backend, result, "status_5xx", upstream.status, detail, upstream
                    )
                first = await upstream.content.readany()
        except TimeoutError:
            if upstream is not None:
                upstream.close()
            return self._failed(backend, result, "timeout")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as e:
            if upstream is not None:
                upstream.close()
            log.debug("upstream %s failed before first byte: %r", backend.url, e)
            if upstream is None and _stale(e) and result.stale_retry is None:
                result.stale_retry = backend.url
                return StaleConnection()
            return self._failed(backend, result, "connect")
        except asyncio.CancelledError:
            if upstream is not None:
                upstream.close()
            result.client_aborted = True
            raise

        result.backend = backend
        result.status = upstream.status
        result.first_byte_at = self.clock()
        self.pool.record_success(backend)
        on_commit(backend)
        return await self._stream(request, upstream, first, backend, response_headers, result)

    async def _stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        first: bytes,
        backend: Backend,
        response_headers: Mapping[str, str],
        result: ForwardResult,
    ) -> web.StreamResponse:
        out_headers = CIMultiDict(
            (k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
        )
        out_headers.update(response_headers)
        if upstream.content.is_eof() and upstream.content_length == len(first):
            # The whole (non-streamed) answer came with the head: one write, not two.
            upstream.release()
            out_headers.pop("Content-Type", None)
            return web.Response(
                status=upstream.status,
                reason=upstream.reason,
                body=first,
                headers=out_headers,
                content_type=upstream.content_type,
                charset=upstream.charset,
            )
        resp = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=out_headers
        )
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        is_sse = upstream.content_type == "text/event-stream"
        try:
            await resp.prepare(request)
            if first:
                await resp.write(first)
            while True:
                try:
                    chunk = await upstream.content.readany()
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    await self._midstream_failure(request, resp, backend, result, is_sse, e)
                    return resp
                if not chunk:
                    break
                await resp.write(chunk)
            await resp.write_eof()
        except ConnectionResetError:
            result.client_aborted = True
            self.metrics.client_aborts.inc()
        except asyncio.CancelledError:
            result.client_aborted = True
            self.metrics.client_aborts.inc()
            raise
        finally:
            if upstream.content.is_eof():
                upstream.release()
            else:
                upstream.close()
        return resp

    async def _midstream_failure(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        backend: Backend,
        result: ForwardResult,
        is_sse: bool,
        error: BaseException,
    ) -> None:
        result.error_kind = "midstream"
        self.metrics.upstream_errors.labels(backend.url, "midstream").inc()
        if self.pool.record_failure(backend, self.clock()):
            self.metrics.ejections.labels(backend.url).inc()
        log.warning("upstream %s failed mid-stream: %r", backend.url, error)
        if is_sse:
            body = error_body(
                502, f"upstream failed mid-stream: {type(error).__name__}", "upstream_midstream"
            )
            with contextlib.suppress(ConnectionResetError):
                await resp.write(b"data: " + body + b"\n\n")
                await resp.write_eof()
        elif request.transport is not None:
            request.transport.close()

    def _failed(
        self,
        backend: Backend,
        result: ForwardResult,
        kind: str,
        status: int = 0,
        detail: bytes = b"",
        upstream: aiohttp.ClientResponse | None = None,
    ) -> ProxyError:
        result.error_kind = kind
        result.trace.upstream_failed(kind, status)
        self.metrics.upstream_errors.labels(backend.url, kind).inc()
        if self.pool.record_failure(backend, self.clock()):
            self.metrics.ejections.labels(backend.url).inc()
        if kind == "timeout":
            return ProxyError(504, "upstream timed out before the first byte", "upstream_timeout")
        if kind == "status_5xx":
            return UpstreamStatusError(status, detail, upstream.content_type if upstream else None)
        return ProxyError(
            502, "could not reach any backend for the request", "upstream_unavailable"
        )


class StaleConnection(ProxyError):
    """A pooled keep-alive connection the backend had already closed: not the backend's
    fault, so it is retried once on a fresh connection and not counted against it."""

    def __init__(self) -> None:
        super().__init__(502, "upstream closed a pooled connection", "upstream_unavailable")


def _stale(error: BaseException) -> bool:
    """The connection broke on first use (reset, or closed before any response), as opposed
    to a connect that failed: the mark of a keep-alive connection the server dropped."""
    return isinstance(error, aiohttp.ServerDisconnectedError) or (
        isinstance(error, aiohttp.ClientOSError)
        and not isinstance(error, aiohttp.ClientConnectorError)
    )


class UpstreamStatusError(ProxyError):
    """The last backend answered 5xx: its own status and body go to the client unchanged."""

    def __init__(self, status: int, body: bytes, content_type: str | None) -> None:
        super().__init__(status, "upstream error", "upstream_status")
        self.body = body
        self.content_type = content_type or "application/json"

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(
            status=self.status, body=self.body, content_type=self.content_type, headers=headers
        )
