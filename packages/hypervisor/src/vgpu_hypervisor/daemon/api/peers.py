"""Who is at the other end of an API connection, for the per-client connection limits.

Every local user connects from 127.0.0.1 (or the node's own address), so an address alone would
put a tenant and the admin in one group. A unix socket names its peer's user (SO_PEERCRED); a
TCP connection from this host is looked up in the kernel's socket table for the user owning the
client's end (NETLINK_SOCK_DIAG, the query behind `ss -e`: one exact lookup, no listing, no
privilege needed). A TCP client that is not on this host (another machine, or a pod in its own
network namespace) is its address.
"""

import asyncio
import ipaddress
import socket
import struct
from typing import Final

_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST: Final = 1
_NO_COOKIE: Final = 0xFFFFFFFF
_ALL_STATES: Final = 0xFFFFFFFF
_NLMSG_HEADER: Final = struct.Struct("=IHHII")
# struct inet_diag_req_v2 without its sockid, then struct inet_diag_sockid.
_REQUEST: Final = struct.Struct("=BBBxI")
_SOCKID_PORTS: Final = struct.Struct(">HH")
_SOCKID_TAIL: Final = struct.Struct("=III")  # idiag_if, idiag_cookie[2]
# struct inet_diag_msg: family, state, timer, retrans, the 48-byte sockid, then expires,
# rqueue, wqueue, uid, inode.
_MESSAGE_PORTS: Final = 4
_MESSAGE_UID: Final = 4 + 48 + 12


def client_of(transport: asyncio.BaseTransport) -> str:
    """A name for the client of ``transport``: ``uid N`` when its user is known, else
    ``address A``; ``unknown`` when the transport says nothing."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return "unknown"
    if sock.family == socket.AF_UNIX:
        uid = _unix_peer_uid(sock)
        return "unknown" if uid is None else f"uid {uid}"
    peer = transport.get_extra_info("peername")
    local = transport.get_extra_info("sockname")
    if not isinstance(peer, tuple) or not isinstance(local, tuple):
        return "unknown"
    uid = tcp_owner((peer[0], peer[1]), (local[0], local[1]))
    return f"address {peer[0]}" if uid is None else f"uid {uid}"


def _unix_peer_uid(sock: socket.socket) -> int | None:
    try:
        credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return None
    uid: int = struct.unpack("=iii", credentials)[1]
    return uid


def _packed(host: str) -> tuple[int, bytes] | None:
    """Address family and the 16 bytes of idiag_src/idiag_dst; IPv4 inside IPv6 (a dual-stack
    listener's view of an IPv4 client) as the IPv4 socket the client really has."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    return family, address.packed.ljust(16, b"\0")


def tcp_owner(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client's end of a TCP connection from this host to ``server``; None
    when it is not on this host (or in another network namespace) or the kernel cannot say."""
    source, destination = _packed(client[0]), _packed(server[0])
    if source is None or destination is None or source[0] != destination[0]:
        return None
    family = source[0]
    # The client's socket: its local end is the client address, its remote end the server's.
    sockid = (
        _SOCKID_PORTS.pack(client[1], server[1])
        + source[1]
        + destination[1]
        + _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
    )
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, _ALL_STATES) + sockid
    header = _NLMSG_HEADER.pack(
        _NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0
    )
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as netlink:
            netlink.send(header + request)
            # The kernel answers within send(); never wait on the event loop's thread.
            reply = netlink.recv(4096, socket.MSG_DONTWAIT)
    except OSError:
        return None
    body = _NLMSG_HEADER.size
    if len(reply) < body + _MESSAGE_UID + 4:
        return None
    kind = _NLMSG_HEADER.unpack_from(reply)[1]
    if kind != _SOCK_DIAG_BY_FAMILY:  # NLMSG_ERROR: no such socket here
        return None
    if _SOCKID_PORTS.unpack_from(reply, body + _MESSAGE_PORTS) != (client[1], server[1]):
        return None
    uid: int = struct.unpack_from("=I", reply, body + _MESSAGE_UID)[0]
    return uid
