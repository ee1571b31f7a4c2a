"""The API under hostile local clients, over real sockets against a live daemon: connections
that never finish a request (the 300 that once kept /healthz at 503), a client of another user
that reconnects as fast as it is closed, a reply nobody reads, reads without the token, and a
tenant flapping its own region while the admin changes its pod.

Timings are generous (a loaded 2-core machine): an answer "in time" is one within the client's
10 s timeout, while the attack goes on; nothing here measures latency."""

import contextlib
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from vgpu_hypervisor.daemon.api.connections import Clients, ConnectionLimits, GuardedProtocol
from vgpu_hypervisor.daemon.api.peers import tcp_owner

from tests.hypervisor.conftest import TF_HYPERVISOR, WORKLOAD, Daemon, TokenFile, wait_for
from tests.support.tenant import NOBODY, needs_root, tenant_tools

LIMITS = ConnectionLimits()  # the daemon's
SECRET = "--secret-token=hunter2-do-not-show"
# What the idle connections send: nothing, half a request line, a request line and a header
# but never the blank line that ends the head.
PARTIAL = (b"", b"GET /api/v1/sta", b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
NO_AUTH = httpx.Auth()  # a request without the token the daemon's client adds
READS = ("/api/v1/status", "/api/v1/gpus", "/api/v1/pods", "/api/v1/workers", "/metrics")


def _pod(daemon: Daemon, name: str, owner: int | None = None) -> None:
    body: dict[str, Any] = {"name": name, "gpus": {"0": {"memory": "1GiB", "compute": 50}}}
    if owner is not None:
        body["owner"] = owner
    reply = daemon.api("POST", "/api/v1/pods", json=body)
    assert reply.status_code == 201, reply.text


def _admin_round(daemon: Daemon, pod: str, compute: int) -> list[int]:
    """What a liveness probe and an admin ask, each on a connection of its own as a probe or a
    CLI call makes, with a 10 s timeout: the probe, a read and a change (with the token)."""
    socket_path = daemon.extra[1].removeprefix("unix:") if daemon.extra[:1] == ("--listen",) else ""
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    if socket_path:
        transport = httpx.HTTPTransport(uds=socket_path, limits=no_reuse)
        http = httpx.Client(transport=transport, base_url="http://tf-hypervisor", timeout=10)
    else:
        http = httpx.Client(base_url=f"http://127.0.0.1:{daemon.port}", limits=no_reuse, timeout=10)
    auth = {"Authorization": f"Bearer {daemon.token}"}
    with http:
        return [
            http.get("/healthz").status_code,
            http.get("/api/v1/status", headers=auth).status_code,
            http.patch(
                f"/api/v1/pods/default/{pod}",
                json={"gpus": {"0": {"compute": compute}}},
                headers=auth,
            ).status_code,
        ]


def _open_idle(connect: Callable[[], socket.socket], count: int) -> list[socket.socket]:
    held = []
    for i in range(count):
        sock = connect()
        if PARTIAL[i % 3]:
            sock.sendall(PARTIAL[i % 3])
        held.append(sock)
    return held


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def unix_daemon() -> Iterator[Daemon]:
    """A daemon on a unix socket (a short folder: the socket path has 107 bytes at most)."""
    root = Path(tempfile.mkdtemp(prefix="vgpu-api-"))
    running = Daemon(root)
    socket_path = root / "api.sock"
    running.extra = ("--listen", f"unix:{socket_path}")
    running.http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(socket_path)),
        base_url="http://tf-hypervisor",
        timeout=10,
        auth=TokenFile(running.token_file),
    )
    running.start()
    try:
        yield running
    finally:
        running.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("listener", ["tcp", "unix"])
def test_300_connections_without_a_request_leave_healthz_and_the_admin_answered(
    listener: str, request: pytest.FixtureRequest
) -> None:
    target: Daemon = request.getfixturevalue("daemon" if listener == "tcp" else "unix_daemon")
    _pod(target, "train")
    if listener == "tcp":

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", target.port), timeout=30)

    else:
        path = target.extra[1].removeprefix("unix:")

        def connect() -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(30)
            sock.connect(path)
            return sock

    held = _open_idle(connect, 300)
    try:
        # Rounds over more than the head timeout: the connections the limits closed at once,
        # and those still waiting for their heads' deadline, alike.
        started = time.monotonic()
        compute = 30
        while time.monotonic() - started < LIMITS.head_timeout_s * 1.5:
            assert _admin_round(target, "train", compute) == [200, 200, 200]
            compute = 70 if compute == 30 else 30
            time.sleep(0.5)
        # The daemon held at most a client's share of them, and none for ever.
        for sock in held:
            assert _closed_by_server(sock, LIMITS.request_timeout_s * 2)
    finally:
        for sock in held:
            sock.close()
    log = target.log_file.read_text()
    assert "more than 32 connections" in log and "Traceback" not in log


def _attack(port: int, count: int, seconds: float, report: int) -> None:
    """In a forked child, as nobody: hold ``count`` connections that never finish a request,
    opening another the moment the server closes one, for ``seconds``; write what happened."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    selector = selectors.DefaultSelector()
    opened = closed = 0

    def open_one(i: int) -> None:
        nonlocal opened
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        if PARTIAL[i % 3]:
            sock.sendall(PARTIAL[i % 3])
        selector.register(sock, selectors.EVENT_READ, i)
        opened += 1

    for i in range(count):
        open_one(i)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.2):
            sock = cast(socket.socket, key.fileobj)
            try:
                gone = sock.recv(4096) == b""
            except OSError:
                gone = True
            if gone:
                selector.unregister(sock)
                sock.close()
                closed += 1
                open_one(key.data)
    os.write(report, json.dumps({"opened": opened, "closed": closed}).encode())


@needs_root
def test_another_user_reconnecting_as_fast_as_it_is_closed_keeps_no_one_out(
    daemon: Daemon,
) -> None:
    # Another user: the limits group connections by user, so this attacker's reconnections
    # push out only its own; a user attacking itself is not what they are for.
    _pod(daemon, "train")
    seconds = LIMITS.head_timeout_s * 3
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the attacker
        code = 0
        try:
            os.close(reading)
            _attack(daemon.port, 300, seconds, writing)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(writing)
    try:
        rounds = 0
        started = time.monotonic()
        compute = 30
        while time.monotonic() - started < seconds - 1:
            assert _admin_round(daemon, "train", compute) == [200, 200, 200]
            compute = 70 if compute == 30 else 30
            rounds += 1
        _, status = os.waitpid(child, 0)
        child = 0
        assert os.waitstatus_to_exitcode(status) == 0
        report = json.loads(os.read(reading, 4096))
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        os.close(reading)
    assert rounds >= 3
    # The attacker lost all but a client's share of its connections, again and again.
    assert report["closed"] >= 300 - LIMITS.per_client
    log = daemon.log_file.read_text()
    shed = f"API client uid {NOBODY}: more than {LIMITS.per_client} connections"
    assert log.count(shed) == 1  # once a minute, not once a connection


def test_a_client_past_its_share_loses_its_oldest_waiting_connections(daemon: Daemon) -> None:
    extra = 8
    opened = time.monotonic()
    held = [
        socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
        for _ in range(LIMITS.per_client + extra)
    ]
    try:
        for sock in held[:extra]:
            assert _closed_by_server(sock, LIMITS.head_timeout_s * 2)
        readable, _, _ = select.select(held[extra:], [], [], 0.2)
        if time.monotonic() - opened < LIMITS.head_timeout_s * 0.9:
            assert not readable  # before the heads' deadline, the newest are still open
        # A request sent whole is served meanwhile, on a new connection or a kept one.
        assert daemon.http.get("/api/v1/gpus").status_code == 200
        for sock in held[extra:]:
            assert _closed_by_server(sock, LIMITS.head_timeout_s * 3)
    finally:
        for sock in held:
            sock.close()


def test_a_reply_nobody_reads_is_dropped(daemon: Daemon) -> None:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # /openapi.json needs no token and is tens of KiB: a few hundred pipelined copies fill
        # both sockets' buffers and then the server's, and it waits on a client that never reads.
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 400)
        line = f"connection closed: reply unread for {LIMITS.write_stall_s:g} s"
        wait_for(lambda: line in daemon.log_file.read_text(), timeout=LIMITS.write_stall_s * 3)
    assert daemon.http.get("/healthz").status_code == 200


# --- reads and the token ------------------------------------------------------------------


def _worker_with_a_secret(daemon: Daemon, pod: str) -> subprocess.Popen[str]:
    """A worker whose command line carries a secret, as people's programs' often do."""
    return subprocess.Popen(
        [f"train.py {SECRET}", "--alloc", "256MiB", "--hold", "60"],
        executable=WORKLOAD,
        env=daemon.workload_environment(pod),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _seen(daemon: Daemon, pod: str) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = daemon.http.get("/api/v1/workers", params={"pod": pod}).json()
    return [w for w in workers if w["command"]]


def test_reads_need_the_token_and_never_show_a_command_line_without_it(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    _pod(daemon, "secret")
    workloads.append(_worker_with_a_secret(daemon, "secret"))
    (worker,) = wait_for(lambda: _seen(daemon, "secret"), timeout=15)
    assert SECRET in worker["command"]
    for path in (*READS, "/api/v1/pods/default/secret"):
        anonymous = daemon.http.get(path, auth=NO_AUTH)
        assert anonymous.status_code == 401, (path, anonymous.text)
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert "needs the API token" in anonymous.json()["error"]
        assert "api_open_reads" in anonymous.json()["error"]
        wrong = daemon.http.get(path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json() == {"error": "wrong API token"}
        assert daemon.http.get(path).status_code == 200, path
    for path in ("/healthz", "/readyz", "/openapi.json"):
        assert daemon.http.get(path, auth=NO_AUTH).status_code == 200, path


@pytest.fixture
def open_daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path, extra=("--api-open-reads", "all"))
    running.start()
    try:
        yield running
    finally:
        running.close()


def test_open_reads_answer_without_the_token_but_never_with_command_lines(
    open_daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    daemon = open_daemon
    _pod(daemon, "secret")
    workloads.append(_worker_with_a_secret(daemon, "secret"))
    wait_for(lambda: _seen(daemon, "secret"), timeout=15)
    for path in (*READS, "/api/v1/pods/default/secret"):
        anonymous = daemon.http.get(path, auth=NO_AUTH)
        assert anonymous.status_code == 200, (path, anonymous.text)
        assert "hunter2" not in anonymous.text, path
        # A token that is given is checked: a wrong one is not taken for no token.
        wrong = daemon.http.get(path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401, path
        # Nor one of another scheme, nor a wrong one after the right one (only the first
        # header was read: 200).
        basic = daemon.http.get(path, headers={"Authorization": "Basic bm9wZQ=="}, auth=NO_AUTH)
        assert basic.status_code == 401, path
        token = daemon.token_file.read_text().strip()
        two = [("Authorization", f"Bearer {token}"), ("Authorization", "Bearer nope")]
        assert daemon.http.get(path, headers=two, auth=NO_AUTH).status_code == 400, path
    anonymous_workers = daemon.http.get("/api/v1/workers", auth=NO_AUTH).json()
    assert anonymous_workers and all(w["command"] is None for w in anonymous_workers)
    assert any(SECRET in (w["command"] or "") for w in daemon.http.get("/api/v1/workers").json())
    # Changes need the token whatever reads do.
    body = {"name": "other", "gpus": {"0": {"memory": "1GiB"}}}
    assert daemon.http.post("/api/v1/pods", json=body, auth=NO_AUTH).status_code == 401


def test_only_the_named_read_areas_open(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, extra=("--api-open-reads", "node,metrics"))
    daemon.start()
    try:
        for path, status in [
            ("/api/v1/status", 200),
            ("/api/v1/gpus", 200),
            ("/metrics", 200),
            ("/api/v1/pods", 401),
            ("/api/v1/workers", 401),
        ]:
            assert daemon.http.get(path, auth=NO_AUTH).status_code == status, path
        line = next(
            line for line in daemon.log_file.read_text().splitlines() if "API listening" in line
        )
        assert line.endswith("reads without the token: node,metrics")
    finally:
        daemon.close()


def _cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with the daemon's address and the given flags (a token file or none)."""
    return subprocess.run(
        [*TF_HYPERVISOR, *args, "--listen", f"127.0.0.1:{daemon.port}"],
        env=daemon.environment,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_cli_reads_with_the_token_file_and_says_what_to_do_without_it(
    daemon: Daemon, tmp_path: Path
) -> None:
    admin = _cli(daemon, "workers", "--json", "--token-file", str(daemon.token_file))
    assert admin.returncode == 0, admin.stderr
    missing = tmp_path / "no-such-token"
    refused = _cli(daemon, "pods", "list", "--token-file", str(missing))
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()
    assert "this request needs the API token" in line
    assert f"cannot read the API token {missing}" in line


def test_the_cli_reads_open_areas_without_a_token(
    open_daemon: Daemon, tmp_path: Path, workloads: list[subprocess.Popen[str]]
) -> None:
    _pod(open_daemon, "secret")
    workloads.append(_worker_with_a_secret(open_daemon, "secret"))
    wait_for(lambda: _seen(open_daemon, "secret"), timeout=15)
    listing = _cli(open_daemon, "workers", "--json", "--token-file", str(tmp_path / "none"))
    assert listing.returncode == 0, listing.stderr
    (worker,) = json.loads(listing.stdout)
    assert worker["pod"] == "secret" and worker["command"] is None


# --- a tenant's region under the admin's changes ------------------------------------------


def _flap(region: Path, original: bytes, stop: threading.Event) -> int:
    """Truncate, cut in half, scribble over and restore the region, as its tenant may."""
    flaps = 0
    with region.open("r+b") as file:
        while not stop.is_set():
            for damage in ("empty", "half", "scribbled"):
                if damage == "empty":
                    file.truncate(0)
                elif damage == "half":
                    file.truncate(len(original) // 2)
                else:
                    file.seek(0)
                    file.write(b"\xff" * 64)
                file.flush()
                time.sleep(0.002)
                file.seek(0)
                file.write(original)
                file.truncate(len(original))
                file.flush()
                time.sleep(0.002)
                flaps += 1
    return flaps


def _flap_as_tenant(region: Path, original: bytes, seconds: float) -> int:
    """Flap the region for ``seconds``: as its owner, nobody, in a forked child where the
    suite runs as root (a real tenant), else in this process as this user; the flaps made."""
    stop = threading.Event()
    if os.geteuid() != 0:
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        return _flap(region, original, stop)
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the tenant
        code = 0
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            threading.Timer(seconds, stop.set).start()
            os.write(writing, str(_flap(region, original, stop)).encode())
        except BaseException as error:
            os.write(writing, f"{type(error).__name__}: {error}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(writing)
    try:
        _, status = os.waitpid(child, 0)
        said = os.read(reading, 4096).decode()
        assert os.waitstatus_to_exitcode(status) == 0, said
        return int(said)
    finally:
        os.close(reading)


@pytest.fixture
def tenant_node(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose pod folders the tenant (nobody) reaches where the suite runs as root:
    under a folder every user can read, not the test's own (mode 0700)."""
    with contextlib.ExitStack() as stack:
        root = tmp_path
        if os.geteuid() == 0:
            root = stack.enter_context(tenant_tools()).root / "node"
        running = Daemon(root)
        stack.callback(running.close)
        running.start()
        yield running


def test_a_tenant_flapping_its_region_never_makes_a_change_a_500(tenant_node: Daemon) -> None:
    daemon = tenant_node
    _pod(daemon, "flap", owner=NOBODY if os.geteuid() == 0 else None)
    region = daemon.base / "default" / "flap" / "shm"
    original = region.read_bytes()
    answers: dict[int, int] = {}
    errors: set[str] = set()
    flaps: list[int] = []
    tenant = threading.Thread(target=lambda: flaps.append(_flap_as_tenant(region, original, 10)))
    tenant.start()
    try:
        compute = 30
        while tenant.is_alive():
            reply = daemon.api(
                "PATCH", "/api/v1/pods/default/flap", json={"gpus": {"0": {"compute": compute}}}
            )
            answers[reply.status_code] = answers.get(reply.status_code, 0) + 1
            if reply.status_code != 200:
                error = reply.json()["error"]
                assert "\n" not in error
                errors.add(error)
            compute = 40 if compute == 30 else 30
    finally:
        tenant.join()
    assert flaps and flaps[0] > 0
    # A region caught broken is a 4xx naming it (409 mostly; 404 when the scribble reads as
    # deleted), never a 5xx.
    assert all(200 <= status < 300 or 400 <= status < 500 for status in answers), answers
    assert sum(n for status, n in answers.items() if status >= 400) > 0, "no change met it"
    assert answers.get(200, 0) > 0, answers
    # Whole again, the region takes changes as before.
    region.write_bytes(original)
    reply = daemon.api("PATCH", "/api/v1/pods/default/flap", json={"gpus": {"0": {"compute": 20}}})
    assert reply.status_code == 200, reply.text
    log = daemon.log_file.read_text()
    assert "internal error" not in log and "Traceback" not in log


# --- the pieces, directly -------------------------------------------------------------------


def test_the_owner_of_a_local_tcp_client_is_its_user() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()
        with socket.create_connection(address) as client:
            accepted, peer = server.accept()
            with accepted:
                assert tcp_owner(peer, address) == os.geteuid()
                assert tcp_owner(("127.0.0.1", 1), address) is None  # no such connection
                assert tcp_owner(("192.0.2.1", peer[1]), address) is None  # not on this host
                assert client.getsockname() == peer


class _Connection:
    """A stand-in with what Clients reads of a connection, to count past the total."""

    def __init__(self, client: str, waiting: bool = True, unread: bool = False) -> None:
        self.client_key = client
        self.waiting = waiting
        self.closed = False
        self._unread = unread

    def unread(self) -> bool:
        return self._unread

    def close(self, why: str) -> None:
        self.closed = True


def test_past_the_total_the_largest_client_gives_way() -> None:
    clients = Clients(ConnectionLimits(per_client=4, total=6))

    def add(client: str, waiting: bool = True, unread: bool = False) -> _Connection:
        connection = _Connection(client, waiting, unread)
        clients.add(cast(GuardedProtocol, connection))
        return connection

    flood = [add("uid 1000") for _ in range(4)]
    busy = add("uid 0", waiting=False)
    probe = add("uid 0")
    assert not any(c.closed for c in [*flood, busy, probe])
    newcomer = add("address 10.0.0.7")  # the seventh: the flood's oldest gives way
    assert [c.closed for c in flood] == [True, False, False, False]
    assert not busy.closed and not probe.closed and not newcomer.closed
    fifth = add("uid 1000")  # past the total again: the flood is still the largest
    assert [c.closed for c in flood] == [True, True, False, False]
    assert not fifth.closed and not probe.closed and not newcomer.closed
    sixth = add("uid 1000")  # past its own share and the total: one of its own, once
    assert [c.closed for c in flood] == [True, True, True, False]
    assert not sixth.closed and not probe.closed and not newcomer.closed


def test_what_gives_way_first_an_idle_one_then_an_older_one_the_newcomer_last() -> None:
    clients = Clients(ConnectionLimits(per_client=2, total=100))

    def add(unread: bool = False, waiting: bool = True) -> _Connection:
        connection = _Connection("uid 0", waiting, unread)
        clients.add(cast(GuardedProtocol, connection))
        return connection

    sent = add(unread=True)  # its request is in the socket, not yet read
    idle = add()
    third = add()  # idle goes, not the request the server has not read yet
    assert (sent.closed, idle.closed, third.closed) == (False, True, False)
    third._unread = True
    fourth = add()  # nothing idle but the newcomer: the oldest waiting goes, not the newcomer
    assert (sent.closed, third.closed, fourth.closed) == (True, False, False)
    fourth.waiting = third.waiting = False  # both busy with requests
    fifth = add()
    assert (third.closed, fourth.closed, fifth.closed) == (False, False, True)


def test_clients_whose_replies_stall_cannot_shut_every_newcomer_out() -> None:
    """A few clients holding the server's every connection busy (pipelined requests whose
    replies they never read): past the total, the largest client's oldest gives way, not the
    newcomer (a liveness probe, say)."""
    clients = Clients(ConnectionLimits(per_client=4, total=6))

    def add(client: str, waiting: bool) -> _Connection:
        connection = _Connection(client, waiting, False)
        clients.add(cast(GuardedProtocol, connection))
        return connection

    stalled = [add("address 10.0.0.8", waiting=False) for _ in range(4)]
    stalled += [add("address 10.0.0.9", waiting=False) for _ in range(2)]
    probe = add("address 10.0.0.1", waiting=True)
    assert not probe.closed
    assert [c.closed for c in stalled] == [True, False, False, False, False, False]
