"""Where the backends are: static URLs, DNS (A/AAAA or SRV), Kubernetes EndpointSlices.

Every source runs until cancelled and reports the complete current set of backend
base URLs whenever it changes. A source that cannot tell right now (DNS timeout, API
server down) keeps quiet rather than reporting an empty set: a resolver hiccup must
not drain the fleet. Only a definite answer ("no such name", no ready endpoints)
empties it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from proxy.backends import dns
from proxy.config import BackendsConfig

log = logging.getLogger(__name__)

OnChange = Callable[[frozenset[str]], None]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_EVENT_BYTES = 16 << 20


class Discovery(Protocol):
    async def run(self, on_change: OnChange) -> None:
        """Report the current backend set now and on every change; return only when cancelled."""


def base_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port`` with IPv6 hosts in brackets."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class StaticDiscovery:
    """A fixed list from the config."""

    def __init__(self, urls: Iterable[str]) -> None:
        self.urls = frozenset(u.rstrip("/") for u in urls)

    async def run(self, on_change: OnChange) -> None:
        on_change(self.urls)
        await asyncio.Event().wait()


class DnsDiscovery:
    """Re-resolve a name every ``interval_s``.

    A/AAAA mode: every address of ``name`` on ``port``, through the system resolver
    (hosts file, search domains) or, when ``nameserver`` is set, by asking it directly.
    SRV mode: every target:port of the SRV records of ``name`` (fully qualified, e.g.
    ``_http._tcp.vllm.ns.svc.cluster.local``), asked of ``nameserver`` or of the
    resolv.conf nameservers in turn. SRV priority and weight are ignored: every target
    is a backend and the router balances by measured load.
    """

    def __init__(
        self,
        name: str,
        port: int = 8000,
        scheme: str = "http",
        interval_s: float = 10.0,
        srv: bool = False,
        nameserver: str | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        self.name = name
        self.port = port
        self.scheme = scheme
        self.interval_s = interval_s
        self.srv = srv
        self.nameservers = [dns.parse_nameserver(nameserver)] if nameserver else None
        self.timeout_s = timeout_s

    async def run(self, on_change: OnChange) -> None:
        last: frozenset[str] | None = None
        while True:
            try:
                urls = await self.resolve()
            except dns.DnsError as e:
                log.warning(
                    "dns discovery %s: %s; keeping %d backends", self.name, e, len(last or ())
                )
            else:
                if urls != last:
                    last = urls
                    on_change(urls)
            await asyncio.sleep(self.interval_s)

    async def resolve(self) -> frozenset[str]:
        """The current set, or DnsError when no server gave a definite answer."""
        if self.srv:
            records = await self._ask(self.name, dns.SRV)
            return frozenset(
                base_url(self.scheme, r.target, r.port)
                for r in records
                if isinstance(r, dns.SrvRecord) and r.target and r.port
            )
        if self.nameservers is None:
            addresses = await self._system_addresses()
        else:
            addresses = [*await self._ask(self.name, dns.A), *await self._ask(self.name, dns.AAAA)]
        return frozenset(
            base_url(self.scheme, a, self.port) for a in addresses if isinstance(a, str)
        )

    async def _ask(self, name: str, qtype: int) -> list[str] | list[dns.SrvRecord]:
        servers = self.nameservers or dns.system_nameservers()
        if not servers:
            raise dns.DnsError("no nameserver configured or in /etc/resolv.conf")
        errors = []
        for server in servers:
            try:
                return await dns.query(name, qtype, server, self.timeout_s)
            except dns.DnsError as e:
                errors.append(str(e))
        raise dns.DnsError("; ".join(errors))

    async def _system_addresses(self) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            raise dns.DnsError(f"getaddrinfo: {e}") from e
        return [str(info[4][0]).split("%")[0] for info in infos]


class KubernetesApiError(Exception):
    """The API server said no, or said something that is not an EndpointSlice stream."""


class _Gone(Exception):
    """The resourceVersion we hold is too old: list again."""


class KubernetesDiscovery:
    """List and watch the EndpointSlices of one Service; ready endpoints only.

    Defaults come from the pod itself (KUBERNETES_SERVICE_HOST/PORT and the service
    account's token, CA and namespace files). The token is re-read on every request
    because projected tokens rotate. Errors back off exponentially up to
    ``backoff_s[1]``; a 410 Gone (expired resourceVersion, routine after etcd
    compaction) lists again after the shortest back-off.
    Endpoints whose ``conditions.ready`` is absent count as ready, as the API defines.
    Without ``port_name`` the slice's first port is used.
    """

    def __init__(
        self,
        service: str,
        namespace: str | None = None,
        port_name: str | None = None,
        scheme: str = "http",
        api_server: str | None = None,
        token_path: Path = SERVICE_ACCOUNT / "token",
        ca_path: Path = SERVICE_ACCOUNT / "ca.crt",
        namespace_path: Path = SERVICE_ACCOUNT / "namespace",
        watch_timeout_s: float = 300.0,
        backoff_s: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self.service = service
        self.namespace = namespace or _read_text(namespace_path)
        if not self.namespace:
            raise ValueError(
                f"kubernetes discovery: no namespace given and none in {namespace_path}"
            )
        self.api_server = (api_server or _in_cluster_api_server()).rstrip("/")
        self.port_name = port_name
        self.scheme = scheme
        self.token_path = token_path
        self.ca_path = ca_path
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.url = (
            f"{self.api_server}/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        )
        self.selector = f"kubernetes.io/service-name={service}"

    async def run(self, on_change: OnChange) -> None:
        published: frozenset[str] | None = None

        def publish(slices: dict[str, frozenset[str]]) -> None:
            nonlocal published
            urls = frozenset[str]().union(*slices.values())
            if urls != published:
                published = urls
                on_change(urls)

        loop = asyncio.get_running_loop()
        delay = self.backoff_s[0]
        timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=self.watch_timeout_s + 30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    slices, version = await self._list(session)
                    publish(slices)
                    while True:
                        started = loop.time()
                        version, events = await self._watch(session, slices, version, publish)
                        if not events and loop.time() - started < 1.0:
                            raise KubernetesApiError("watch ended at once")
                        delay = self.backoff_s[0]
                except _Gone:
                    log.info(
                        "kubernetes discovery %s: resourceVersion expired, relisting", self.service
                    )
                    await asyncio.sleep(self.backoff_s[0])
                    continue
                except (aiohttp.ClientError, OSError, ValueError, KubernetesApiError) as e:
                    log.warning(
                        "kubernetes discovery %s: %r; retrying in %.1fs", self.service, e, delay
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_s[1])

    async def _list(self, session: aiohttp.ClientSession) -> tuple[dict[str, frozenset[str]], str]:
        params = {"labelSelector": self.selector}
        async with session.get(self.url, params=params, **self._request_options()) as resp:
            if resp.status != 200:
                raise KubernetesApiError(f"list: HTTP {resp.status}")
            doc = _json(await resp.read())
        version = _get(doc, "metadata", "resourceVersion")
        items = _get(doc, "items")
        if not isinstance(version, str) or not isinstance(items, list):
            raise KubernetesApiError("list: not an EndpointSliceList")
        slices = {}
        for item in items:
            name = _get(item, "metadata", "name")
            if isinstance(name, str):
                slices[name] = self._ready_urls(item)
        return slices, version

    async def _watch(
        self,
        session: aiohttp.ClientSession,
        slices: dict[str, frozenset[str]],
        version: str,
        publish: Callable[[dict[str, frozenset[str]]], None],
    ) -> tuple[str, int]:
        """Follow changes until the server ends the stream: (last version, events seen)."""
        params = {
            "labelSelector": self.selector,
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(self.watch_timeout_s)),
        }
        events = 0
        async with session.get(self.url, params=params, **self._request_options()) as resp:
            if resp.status == 410:
                raise _Gone
            if resp.status != 200:
                raise KubernetesApiError(f"watch: HTTP {resp.status}")
            async for line in _lines(resp.content):
                events += 1
                event = _json(line)
                kind, obj = _get(event, "type"), _get(event, "object")
                if kind == "ERROR":
                    if _get(obj, "code") == 410:
                        raise _Gone
                    raise KubernetesApiError(f"watch error: {_get(obj, 'message')!r}")
                newer = _get(obj, "metadata", "resourceVersion")
                version = newer if isinstance(newer, str) and newer else version
                name = _get(obj, "metadata", "name")
                if kind == "BOOKMARK" or not isinstance(name, str):
                    continue
                if kind in ("ADDED", "MODIFIED"):
                    slices[name] = self._ready_urls(obj)
                elif kind == "DELETED":
                    slices.pop(name, None)
                publish(slices)
        return version, events

    def _ready_urls(self, endpoint_slice: Any) -> frozenset[str]:
        """The base URLs of one slice's ready endpoints on the chosen port."""
        ports = [p for p in _items(endpoint_slice, "ports") if isinstance(p, dict)]
        if self.port_name is not None:
            ports = [p for p in ports if p.get("name") == self.port_name]
        port = ports[0].get("port") if ports else None
        if not isinstance(port, int) or not 0 < port < 1 << 16:
            return frozenset()
        urls = set()
        for endpoint in _items(endpoint_slice, "endpoints"):
            if _get(endpoint, "conditions", "ready") is False:
                continue
            for address in _items(endpoint, "addresses"):
                if isinstance(address, str) and address:
                    urls.add(base_url(self.scheme, address, port))
        return frozenset(urls)

    def _request_options(self) -> dict[str, Any]:
        token = _read_text(self.token_path)
        options: dict[str, Any] = {"headers": {"Authorization": f"Bearer {token}"} if token else {}}
        if self.api_server.startswith("https:") and self.ca_path.is_file():
            options["ssl"] = ssl.create_default_context(cafile=str(self.ca_path))
        return options


class MergedDiscovery:
    """Several sources at once; reports the union of what each last reported."""

    def __init__(self, sources: Iterable[Discovery]) -> None:
        self.sources = list(sources)

    async def run(self, on_change: OnChange) -> None:
        latest: dict[int, frozenset[str]] = {}
        published: frozenset[str] | None = None

        def report(i: int, urls: frozenset[str]) -> None:
            nonlocal published
            latest[i] = urls
            union = frozenset[str]().union(*latest.values())
            if union != published:
                published = union
                on_change(union)

        async with asyncio.TaskGroup() as group:
            for i, source in enumerate(self.sources):
                group.create_task(source.run(lambda urls, i=i: report(i, urls)))


def from_config(config: BackendsConfig) -> Discovery | None:
    """The discovery the backends section asks for; None when it names no source."""
    sources: list[Discovery] = []
    if config.static:
        sources.append(StaticDiscovery(config.static))
    if config.dns is not None:
        d = config.dns
        sources.append(DnsDiscovery(d.name, d.port, d.scheme, d.interval_s, d.srv, d.nameserver))
    if config.kubernetes is not None:
        k = config.kubernetes
        sources.append(
            KubernetesDiscovery(
                k.service,
                k.namespace,
                k.port_name,
                k.scheme,
                k.api_server,
                token_path=Path(k.token_path),
                ca_path=Path(k.ca_path),
            )
        )
    if len(sources) > 1:
        return MergedDiscovery(sources)
    return sources[0] if sources else None


def _in_cluster_api_server() -> str:
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT"),
    )
    if not host or not port:
        raise ValueError(
            "kubernetes discovery: no api_server given and KUBERNETES_SERVICE_HOST/PORT unset"
        )
    return base_url("https", host, int(port))


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise KubernetesApiError(f"not JSON: {e}") from e


def _get(doc: Any, *keys: str) -> Any:
    """``doc[k1][k2]...`` or None when any step is missing or not an object."""
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _items(doc: Any, key: str) -> list[Any]:
    """``doc[key]`` when it is a list, else empty."""
    value = _get(doc, key)
    return value if isinstance(value, list) else []


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited watch events of any size up to MAX_EVENT_BYTES."""
    buffer = bytearray()
    async for chunk in stream.iter_any():
        buffer += chunk
        while (cut := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:cut])
            del buffer[: cut + 1]
            if line.strip():
                yield line
        if len(buffer) > MAX_EVENT_BYTES:
            raise KubernetesApiError("watch event larger than MAX_EVENT_BYTES")
    if buffer.strip():
        yield bytes(buffer)
