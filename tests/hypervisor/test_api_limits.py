"""What a client can make the API server hold, over real sockets: body size, read time; and
the warning for open reads reachable from other hosts. Hostile clients: test_api_hostile.py."""

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from vgpu_hypervisor.daemon.api.connections import ConnectionLimits

from tests.hypervisor.conftest import Daemon, wait_for

MiB = 1 << 20
LIMITS = ConnectionLimits()  # the daemon's
POD = b'{"name": "train", "gpus": {"0": {"compute": 30}}}'


def connect(daemon: Daemon) -> socket.socket:
    return socket.create_connection(("127.0.0.1", daemon.port), timeout=30)


def head(daemon: Daemon, length: int | None, *, chunked: bool = False) -> bytes:
    lines = [
        "POST /api/v1/pods HTTP/1.1",
        f"Host: 127.0.0.1:{daemon.port}",
        f"Authorization: Bearer {daemon.token}",
        "Content-Type: application/json",
    ]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_reply(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one reply (Content-Length framed), read to the end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a reply: {data!r}"
        data += chunk
    head_text, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head_text.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def create(daemon: Daemon, body: bytes) -> httpx.Response:
    return daemon.api(
        "POST", "/api/v1/pods", content=body, headers={"Content-Type": "application/json"}
    )


def rss(daemon: Daemon) -> int:
    assert daemon.process is not None
    value: int = psutil.Process(daemon.process.pid).memory_info().rss
    return value


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(head(daemon, 200 * MiB))  # and not one byte of the body
        status, headers, body = read_reply(sock)
        assert status == 413
        assert json.loads(body) == {
            "error": "the request body is larger than the API's limit of 1048576 bytes"
        }
        assert headers["connection"] == "close"
        assert closed_by_server(sock)
    assert create(daemon, POD).status_code == 201


def test_a_chunked_body_is_refused_once_it_passes_the_limit(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(head(daemon, None, chunked=True))
        # 1 MiB and one byte, and no end: the server answers before the body is over.
        for chunk in (b"x" * (256 << 10),) * 4 + (b"x",):
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        status, headers, body = read_reply(sock)
        assert headers["connection"] == "close"
    assert status == 413
    assert "larger than the API's limit" in json.loads(body)["error"]
    assert daemon.http.get("/api/v1/pods").json() == []


def test_large_posts_leave_the_daemon_s_memory_as_it_was(daemon: Daemon) -> None:
    before = rss(daemon)
    for _ in range(8):
        with connect(daemon) as sock:
            sock.sendall(head(daemon, 200 * MiB))
            try:
                sock.sendall(b"x" * (8 * MiB))
                status = read_reply(sock)[0]
            except (BrokenPipeError, ConnectionResetError):
                status = 413  # answered and closed while the body was on its way
            assert status == 413
    assert rss(daemon) - before < 32 * MiB


def test_a_body_at_the_limit_is_read(daemon: Daemon) -> None:
    padded = POD[:-1] + b" " * (MiB - len(POD)) + b"}"
    assert len(padded) == MiB
    reply = create(daemon, padded)
    assert reply.status_code == 201, reply.text


@pytest.fixture
def half_sent(daemon: Daemon) -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def test_requests_not_sent_whole_are_closed_after_their_timeouts(
    daemon: Daemon, half_sent: list[socket.socket]
) -> None:
    opened = time.monotonic()
    # Fewer than a client's share of connections: these are closed by their timeouts alone.
    for i in range(12):
        sock = connect(daemon)
        half_sent.append(sock)
        if i % 3 == 0:
            sock.sendall(head(daemon, len(POD)) + POD[:10])  # half a body
        elif i % 3 == 1:
            sock.sendall(head(daemon, None)[:40])  # half a head
        # else nothing at all
    # Meanwhile the daemon serves others.
    assert daemon.http.get("/healthz").status_code == 200
    assert daemon.http.get("/api/v1/gpus").status_code == 200
    closed_at = []
    for sock in half_sent:
        sock.settimeout(max(LIMITS.request_timeout_s * 3 - (time.monotonic() - opened), 1))
        assert closed_by_server(sock)
        closed_at.append(time.monotonic() - opened)
    # A head has the head timeout; a body what is left of the request timeout.
    for i, when in enumerate(closed_at):
        floor = LIMITS.request_timeout_s if i % 3 == 0 else LIMITS.head_timeout_s
        assert when > floor * 0.9, (i, when)
    assert create(daemon, POD).status_code == 201


def test_a_slow_but_steady_request_within_the_timeout_is_served(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        for piece in (head(daemon, len(POD)), POD[:20], POD[20:]):
            sock.sendall(piece)
            time.sleep(1)
        status, _, body = read_reply(sock)
    assert status == 201, body


def test_a_kept_alive_connection_serves_several_requests(daemon: Daemon) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{daemon.port}") as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
            time.sleep(1)
        assert client.get("/healthz").status_code == 200


def log_lines(daemon: Daemon) -> list[str]:
    return daemon.log_file.read_text().splitlines()


def test_open_reads_beyond_this_host_are_warned_of(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    daemon.extra = ("--listen", f"0.0.0.0:{daemon.port}", "--api-open-reads", "pods,workers")
    daemon.start()
    try:
        warning = wait_for(
            lambda: [line for line in log_lines(daemon) if " WARNING " in line], timeout=10
        )
        assert len(warning) == 1
        assert f"the API listens on 0.0.0.0:{daemon.port}, beyond this host" in warning[0]
        assert "answers reads of pods,workers without a token" in warning[0]
    finally:
        daemon.close()


def test_listening_beyond_this_host_with_reads_closed_gives_no_warning(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    daemon.extra = ("--listen", f"0.0.0.0:{daemon.port}")
    daemon.start()
    try:
        wait_for(lambda: any("API listening on" in line for line in log_lines(daemon)))
        assert not [line for line in log_lines(daemon) if " WARNING " in line]
    finally:
        daemon.close()


def test_listening_on_loopback_gives_no_warning(daemon: Daemon) -> None:
    wait_for(lambda: any("API listening on" in line for line in log_lines(daemon)))
    assert not [line for line in log_lines(daemon) if " WARNING " in line]


def test_a_head_over_64_kib_is_refused(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * (80 << 10))
        status, _, body = read_reply(sock)
    assert status == 400, body
    assert daemon.http.get("/healthz").status_code == 200
