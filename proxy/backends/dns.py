"""A minimal DNS stub resolver: A, AAAA and SRV over UDP, TCP when truncated. Stdlib only.

Why it exists: SRV lookups (backend ports from DNS) need a resolver the standard
library lacks, and discovery must be pointable at a given nameserver (tests run their
own). It asks one recursive nameserver and reads its answer section; it does no
recursion, caching or search-domain expansion, so SRV names must be fully qualified.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

A, AAAA, SRV = 1, 28, 33
_OPT = 41
_CLASS_IN = 1
_NXDOMAIN = 3
_MAX_POINTER_JUMPS = 64

Nameserver = tuple[str, int]


class DnsError(Exception):
    """No usable answer: timeout, server failure, refused, or a malformed reply."""


class _Truncated(DnsError):
    pass


@dataclass(frozen=True, slots=True, order=True)
class SrvRecord:
    priority: int
    weight: int
    port: int
    target: str


async def query(
    name: str, qtype: int, nameserver: Nameserver, timeout_s: float = 2.0
) -> list[str] | list[SrvRecord]:
    """Ask ``nameserver`` for ``name``: addresses for A/AAAA, SrvRecords for SRV.

    A name that does not exist (NXDOMAIN) or has no such records is an empty list:
    a definite answer. Anything else that is not an answer raises DnsError.
    """
    qid = secrets.randbelow(1 << 16)
    packet = encode_query(qid, name, qtype)
    try:
        return decode_response(await _over_udp(packet, qid, nameserver, timeout_s), qid, qtype)
    except _Truncated:
        return decode_response(await _over_tcp(packet, nameserver, timeout_s), qid, qtype)


def encode_query(qid: int, name: str, qtype: int) -> bytes:
    """A recursive query with an EDNS0 record offering 4 kB UDP answers."""
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 1)
    opt = b"\x00" + struct.pack("!HHIH", _OPT, 4096, 0, 0)
    return header + _encode_name(name) + struct.pack("!HH", qtype, _CLASS_IN) + opt


def decode_response(data: bytes, qid: int, qtype: int) -> list[str] | list[SrvRecord]:
    """The records of type ``qtype`` in the answer section of a reply to query ``qid``."""
    if len(data) < 12:
        raise DnsError("reply shorter than a header")
    rid, flags, qdcount, ancount, _, _ = struct.unpack_from("!HHHHHH", data)
    if rid != qid or not flags & 0x8000:
        raise DnsError("not a reply to our query")
    if flags & 0x0200:
        raise _Truncated("truncated")
    rcode = flags & 0x000F
    if rcode == _NXDOMAIN:
        return []
    if rcode:
        raise DnsError(f"server answered rcode {rcode}")
    offset = 12
    for _ in range(qdcount):
        offset = _read_name(data, offset)[1] + 4
    addresses: list[str] = []
    services: list[SrvRecord] = []
    for _ in range(ancount):
        offset = _read_name(data, offset)[1]
        if offset + 10 > len(data):
            raise DnsError("answer runs past the reply")
        rtype, rclass, _ttl, rdlength = struct.unpack_from("!HHIH", data, offset)
        offset += 10
        end = offset + rdlength
        if end > len(data):
            raise DnsError("record data runs past the reply")
        if rtype == qtype and rclass == _CLASS_IN:
            if qtype == A and rdlength == 4:
                addresses.append(str(ipaddress.IPv4Address(data[offset:end])))
            elif qtype == AAAA and rdlength == 16:
                addresses.append(str(ipaddress.IPv6Address(data[offset:end])))
            elif qtype == SRV and rdlength >= 7:
                priority, weight, port = struct.unpack_from("!HHH", data, offset)
                services.append(SrvRecord(priority, weight, port, _read_name(data, offset + 6)[0]))
        offset = end
    return services if qtype == SRV else addresses


def parse_nameserver(text: str) -> Nameserver:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address; port 53 by default."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if not host or (port and not port.isdigit()) or not 0 < int(port or 53) < 1 << 16:
        raise ValueError(f"not a nameserver address: {text!r}")
    return host, int(port or 53)


def system_nameservers(path: Path = Path("/etc/resolv.conf")) -> list[Nameserver]:
    """The nameservers of resolv.conf, in order; empty if it is unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    servers = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                servers.append(parse_nameserver(fields[1].split("%")[0]))
            except ValueError:
                continue
    return servers


def _encode_name(name: str) -> bytes:
    try:
        labels = [label.encode("idna") for label in name.rstrip(".").split(".")]
    except UnicodeError as e:
        raise DnsError(f"cannot encode name {name!r}") from e
    if not all(0 < len(label) < 64 for label in labels) or len(name) > 253:
        raise DnsError(f"not a valid DNS name: {name!r}")
    return b"".join(bytes([len(label)]) + label for label in labels) + b"\x00"


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """A possibly compressed name at ``offset``: (dotted name, offset just past it)."""
    labels: list[str] = []
    end: int | None = None
    for _ in range(_MAX_POINTER_JUMPS):
        if offset >= len(data):
            raise DnsError("name runs past the reply")
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(data):
                raise DnsError("name pointer runs past the reply")
            if end is None:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            continue
        if length & 0xC0:
            raise DnsError("unknown label type")
        if length == 0:
            return ".".join(labels), end if end is not None else offset + 1
        label = data[offset + 1 : offset + 1 + length]
        if len(label) < length:
            raise DnsError("label runs past the reply")
        labels.append(label.decode("ascii", errors="replace"))
        offset += 1 + length
    raise DnsError("name pointers loop")


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, qid: int, reply: asyncio.Future[bytes]) -> None:
        self.qid = qid
        self.reply = reply

    def datagram_received(self, data: bytes, addr: object) -> None:
        if data[:2] == self.qid.to_bytes(2, "big") and not self.reply.done():
            self.reply.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.reply.done():
            self.reply.set_exception(DnsError(f"udp: {exc}"))


async def _over_udp(packet: bytes, qid: int, server: Nameserver, timeout_s: float) -> bytes:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[bytes] = loop.create_future()
    try:
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Receiver(qid, reply), remote_addr=server
        )
    except OSError as e:
        raise DnsError(f"udp to {server[0]}:{server[1]}: {e}") from e
    try:
        transport.sendto(packet)
        async with asyncio.timeout(timeout_s):
            return await reply
    except TimeoutError as e:
        raise DnsError(f"no answer from {server[0]}:{server[1]} in {timeout_s}s") from e
    finally:
        transport.close()


async def _over_tcp(packet: bytes, server: Nameserver, timeout_s: float) -> bytes:
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(*server)
            writer.write(len(packet).to_bytes(2, "big") + packet)
            size = int.from_bytes(await reader.readexactly(2), "big")
            return await reader.readexactly(size)
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
        raise DnsError(f"tcp to {server[0]}:{server[1]}: {e!r}") from e
    finally:
        if writer is not None:
            writer.close()
