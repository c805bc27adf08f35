"""DNS discovery follows a real UDP (and TCP) nameserver on 127.0.0.1 that the test controls."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import struct
from collections.abc import AsyncIterator
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.backends import dns
from proxy.backends.discovery import DnsDiscovery

WAIT_S = 10.0  # bound on every wait; the happy path takes milliseconds


class FakeNameserver(asyncio.DatagramProtocol):
    """Answers A, AAAA and SRV from dicts the test edits; can fail on demand.

    ``mode``: "answer", "servfail", "nxdomain" or "drop" (never replies).
    ``truncate_over`` > 0: UDP answers with more records than that come back empty
    with the TC bit set, and the full answer is served over TCP on the same port.
    """

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], list[bytes]] = {}
        self.mode = "answer"
        self.truncate_over = 0
        self.queries: list[tuple[str, int, str]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def set_a(self, name: str, *addresses: str) -> None:
        for address in addresses:
            ip = ipaddress.ip_address(address)
            qtype = dns.A if ip.version == 4 else dns.AAAA
            self.records.setdefault((name, qtype), []).append(ip.packed)
        self.records.setdefault((name, dns.A), [])

    def set_a_only(self, name: str, *addresses: str) -> None:
        self.records.pop((name, dns.A), None)
        self.records.pop((name, dns.AAAA), None)
        self.set_a(name, *addresses)

    def set_srv(self, name: str, *targets: tuple[str, int]) -> None:
        self.records[(name, dns.SRV)] = [
            struct.pack("!HHH", 0, 10, port) + encode_name(target) for target, port in targets
        ]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = self.reply(data, "udp")
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)

    async def serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            size = int.from_bytes(await reader.readexactly(2), "big")
            reply = self.reply(await reader.readexactly(size), "tcp")
            if reply is not None:
                writer.write(len(reply).to_bytes(2, "big") + reply)
                await writer.drain()
        writer.close()

    def reply(self, query: bytes, transport: str) -> bytes | None:
        qid = query[:2]
        offset, labels = 12, []
        while query[offset]:
            labels.append(query[offset + 1 : offset + 1 + query[offset]].decode())
            offset += 1 + query[offset]
        qtype = struct.unpack_from("!H", query, offset + 1)[0]
        question = query[12 : offset + 5]
        name = ".".join(labels)
        self.queries.append((name, qtype, transport))
        if self.mode == "drop":
            return None
        rcode = {"servfail": 2, "nxdomain": 3}.get(self.mode, 0)
        found = self.records.get((name, qtype), []) if not rcode else []
        if not rcode and (name, dns.A) not in self.records and (name, dns.SRV) not in self.records:
            rcode = 3
        truncated = transport == "udp" and 0 < self.truncate_over < len(found)
        answers = [] if truncated else found
        flags = 0x8180 | rcode | (0x0200 if truncated else 0)
        header = qid + struct.pack("!HHHHH", flags, 1, len(answers), 0, 0)
        body = b"".join(
            struct.pack("!HHHIH", 0xC00C, qtype, 1, 5, len(rdata)) + rdata for rdata in answers
        )
        return header + question + body


def encode_name(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"


@pytest.fixture
async def nameserver() -> AsyncIterator[tuple[FakeNameserver, str]]:
    """The fake on one port for both UDP and TCP."""
    loop = asyncio.get_running_loop()
    fake = FakeNameserver()
    for _ in range(20):
        transport, _ = await loop.create_datagram_endpoint(
            lambda: fake, local_addr=("127.0.0.1", 0)
        )
        port = transport.get_extra_info("sockname")[1]
        try:
            server = await asyncio.start_server(fake.serve_tcp, "127.0.0.1", port)
        except OSError:
            transport.close()
            continue
        yield fake, f"127.0.0.1:{port}"
        server.close()
        transport.close()
        return
    pytest.fail("no port free for both UDP and TCP")


@contextlib.asynccontextmanager
async def running(discovery: DnsDiscovery) -> AsyncIterator[asyncio.Queue[frozenset[str]]]:
    """Run the discovery; yield the queue of sets it reports."""
    reports: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    task = asyncio.create_task(discovery.run(reports.put_nowait))
    try:
        yield reports
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def next_report(reports: asyncio.Queue[frozenset[str]]) -> frozenset[str]:
    return await asyncio.wait_for(reports.get(), WAIT_S)


async def queries_grow_by(fake: FakeNameserver, n: int) -> None:
    target = len(fake.queries) + n
    async with asyncio.timeout(WAIT_S):
        while len(fake.queries) < target:
            await asyncio.sleep(0.01)


async def test_a_and_aaaa_records_are_followed(nameserver: tuple[FakeNameserver, str]) -> None:
    fake, address = nameserver
    fake.set_a("vllm.test", "10.0.0.1", "10.0.0.2")
    discovery = DnsDiscovery("vllm.test", 8000, interval_s=0.02, nameserver=address)
    async with running(discovery) as reports:
        assert await next_report(reports) == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
        fake.set_a_only("vllm.test", "10.0.0.2", "10.0.0.3", "fd00::7")
        assert await next_report(reports) == {
            "http://10.0.0.2:8000",
            "http://10.0.0.3:8000",
            "http://[fd00::7]:8000",
        }
    assert {(q[0], q[1]) for q in fake.queries} == {("vllm.test", dns.A), ("vllm.test", dns.AAAA)}


async def test_srv_records_give_hosts_and_ports(nameserver: tuple[FakeNameserver, str]) -> None:
    fake, address = nameserver
    name = "_http._tcp.vllm.ns.svc.cluster.local"
    fake.set_srv(name, ("a.vllm.test", 8001), ("b.vllm.test", 8002))
    discovery = DnsDiscovery(name, srv=True, interval_s=0.02, nameserver=address)
    async with running(discovery) as reports:
        assert await next_report(reports) == {"http://a.vllm.test:8001", "http://b.vllm.test:8002"}
        fake.set_srv(name, ("b.vllm.test", 8002), ("c.vllm.test", 9000))
        assert await next_report(reports) == {"http://b.vllm.test:8002", "http://c.vllm.test:9000"}


async def test_failures_keep_the_last_set_and_nxdomain_empties_it(
    nameserver: tuple[FakeNameserver, str],
) -> None:
    fake, address = nameserver
    fake.set_a("vllm.test", "10.0.0.1")
    discovery = DnsDiscovery("vllm.test", interval_s=0.01, nameserver=address, timeout_s=0.05)
    async with running(discovery) as reports:
        assert await next_report(reports) == {"http://10.0.0.1:8000"}
        for mode in ("servfail", "drop"):
            fake.mode = mode
            await queries_grow_by(fake, 3)
            assert reports.empty(), f"{mode} must not change the backend set"
        fake.mode = "nxdomain"
        assert await next_report(reports) == frozenset()
        fake.mode = "answer"
        assert await next_report(reports) == {"http://10.0.0.1:8000"}


async def test_truncated_udp_answer_is_asked_again_over_tcp(
    nameserver: tuple[FakeNameserver, str],
) -> None:
    fake, address = nameserver
    name = "_http._tcp.big.test"
    fake.set_srv(name, *((f"r{i}.big.test", 8000 + i) for i in range(40)))
    fake.truncate_over = 10
    discovery = DnsDiscovery(name, srv=True, interval_s=0.02, nameserver=address)
    async with running(discovery) as reports:
        urls = await next_report(reports)
    assert len(urls) == 40
    assert "http://r39.big.test:8039" in urls
    assert [q[2] for q in fake.queries[:2]] == ["udp", "tcp"]


async def test_system_resolver_reads_the_hosts_file() -> None:
    async with running(DnsDiscovery("localhost", 8123, interval_s=0.05)) as reports:
        urls = await next_report(reports)
    assert "http://127.0.0.1:8123" in urls


async def test_unreachable_nameserver_reports_nothing() -> None:
    discovery = DnsDiscovery("vllm.test", interval_s=0.01, nameserver="127.0.0.1:9", timeout_s=0.05)
    with pytest.raises(dns.DnsError):
        await discovery.resolve()


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.0.0.10", ("10.0.0.10", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("[::1]:5353", ("::1", 5353)),
        ("fd00::10", ("fd00::10", 53)),
    ],
)
def test_nameserver_addresses(text: str, parsed: tuple[str, int]) -> None:
    assert dns.parse_nameserver(text) == parsed


@pytest.mark.parametrize("text", ["", "host:port", "1.2.3.4:0", "1.2.3.4:99999", "[::1]:x"])
def test_bad_nameserver_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="nameserver"):
        dns.parse_nameserver(text)


# Replies that pass the header checks (our id, QR set, rcode 0), so the fuzz reaches
# the question and record parsing, plus plain random bytes.
REPLY_HEADERS = st.builds(
    lambda qd, an, body: b"\x12\x34\x81\x80" + struct.pack("!HHHH", qd, an, 0, 0) + body,
    st.integers(0, 3),
    st.integers(0, 5),
    st.binary(max_size=200),
)


@settings(max_examples=300, deadline=None)
@given(REPLY_HEADERS | st.binary(max_size=200), st.sampled_from([dns.A, dns.AAAA, dns.SRV]))
def test_garbage_replies_raise_only_dns_error(data: bytes, qtype: int) -> None:
    with contextlib.suppress(dns.DnsError):
        records = dns.decode_response(data, 0x1234, qtype)
        assert all(isinstance(r, dns.SrvRecord if qtype == dns.SRV else str) for r in records)


def test_compression_loops_are_refused() -> None:
    loop = b"\x12\x34\x81\x80\x00\x00\x00\x01\x00\x00\x00\x00" + b"\xc0\x0c" + b"\x00" * 10
    with pytest.raises(dns.DnsError, match="loop"):
        dns.decode_response(loop, 0x1234, dns.A)
