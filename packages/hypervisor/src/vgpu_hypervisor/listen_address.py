"""The API's listen address: `host:port`, `[ipv6]:port` or `unix:/abs/path`, parsed with
one-line errors; the daemon listens there and the client connects there."""

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

UNIX_PATH_MAX: Final = 107  # sockaddr_un.sun_path holds 108 bytes, the final NUL included


@dataclass(frozen=True)
class TcpAddress:
    """A TCP listen address; `host` is an IPv4 or IPv6 address (no brackets) or a host name."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class UnixAddress:
    """A unix socket listen address."""

    path: Path

    def __str__(self) -> str:
        return f"unix:{self.path}"


ListenAddress = TcpAddress | UnixAddress
LISTEN_FORMS = "expected HOST:PORT, [IPV6]:PORT or unix:/ABSOLUTE/PATH"
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.IGNORECASE)
_SCOPE = re.compile(r"[A-Za-z0-9_.-]+")


def _port(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"port {text!r} is not a number" if text else "the port is missing")
    if len(text.lstrip("0")) > 5 or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {text} is out of range 1-65535")
    return int(text)


def _host(text: str) -> str:
    if re.fullmatch(r"[0-9.]+", text):
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise ValueError(f"{text!r} is not an IPv4 address") from None
    labels = text.split(".")
    if len(text) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{text!r} is not a valid host name or address")
    return text.lower()


def _unix_address(raw: str) -> UnixAddress:
    if not raw or "\0" in raw:
        raise ValueError("a unix socket needs a path: unix:/ABSOLUTE/PATH")
    if not raw.startswith("/"):
        raise ValueError("the unix socket path must be absolute")
    try:
        size = len(os.fsencode(raw))
    except UnicodeEncodeError:
        raise ValueError("the unix socket path is not valid text") from None
    if size > UNIX_PATH_MAX:
        raise ValueError(f"the unix socket path is longer than {UNIX_PATH_MAX} bytes")
    return UnixAddress(Path(raw))


def _bracketed_address(text: str) -> TcpAddress:
    inside, bracket, rest = text[1:].partition("]")
    if not bracket:
        raise ValueError("missing ']' after the IPv6 address")
    address, percent, scope = inside.partition("%")
    try:
        host = str(ipaddress.IPv6Address(address))
    except ValueError:
        raise ValueError(f"{inside!r} is not an IPv6 address") from None
    if percent and not _SCOPE.fullmatch(scope):
        raise ValueError(f"{inside!r} is not an IPv6 address")
    if not rest.startswith(":"):
        raise ValueError(f"expected :PORT after ']'; {LISTEN_FORMS}")
    return TcpAddress(f"{host}%{scope}" if percent else host, _port(rest[1:]))


def parse_listen_address(text: str) -> ListenAddress:
    """Parse `host:port`, `[ipv6]:port` or `unix:/abs/path`; ValueError with one line if bad.
    Port 0 ("any free port") is refused: the CLI finds the daemon through the same setting."""
    if text.startswith("unix:"):
        return _unix_address(text.removeprefix("unix:"))
    if text.startswith("["):
        return _bracketed_address(text)
    host, colon, port = text.rpartition(":")
    if not colon:
        raise ValueError(LISTEN_FORMS)
    if ":" in host:
        raise ValueError("an IPv6 address needs brackets, as in [::1]:8080")
    if not host:
        raise ValueError("the host is missing; 0.0.0.0:PORT or [::]:PORT means all interfaces")
    return TcpAddress(_host(host), _port(port))
