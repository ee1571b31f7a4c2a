"""The daemon's lease arbiter (lease_broker.py, arbiter.c): every paced process gets a seat of
its own over {base}/.node/leases.sock, the arbiter alone decides who holds each GPU's lease, takes
it back from a holder that is done or overruns, and processes follow the daemon when it starts
again. The attacks are those of a tenant in the lease group: where the suite
runs as root they run as the unprivileged user `nobody` (uid 65534), elsewhere as the suite's
own user, which is no more privileged than a tenant either."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pytest
from vgpu_limiter.lease import DeviceLease, lease_path, node_path
from vgpu_limiter.lease_broker import SOCKET_NAME, LeaseBroker
from vgpu_limiter.region import CONSTANTS, ffi

from tests.limiter.conftest import WORKLOAD, LimitedEnv
from tests.limiter.test_compute_limits import SIM_GPU0, TOLERANCE_PP, concurrent, limit
from tests.support.arbiter import (
    ACTIVITY,
    GRANTED,
    MESSAGE,
    MESSAGE_SIZE,
    SEAT_SIZE,
    Client,
    _message,
)
from tests.support.tenant import readable_folder

FORK = get_context("fork")
NOBODY = 65534
EPOCHS = ffi.offsetof("struct vgpu_device_lease", "epochs")
SIZE = ffi.sizeof("struct vgpu_device_lease")


@pytest.fixture
def base() -> Iterator[Path]:
    """A base path another user can reach."""
    with readable_folder("vgpu-leases-") as folder:
        yield folder / "base"


@contextmanager
def broker(base: Path) -> Iterator[LeaseBroker]:
    leases = LeaseBroker(base, [SIM_GPU0])
    leases.start()
    try:
        yield leases
    finally:
        leases.close()


def _become_tenant(group_of: Path) -> None:
    """As root: become `nobody`, a member of the lease folder's group (the attack needs one)."""
    if os.geteuid() == 0:
        os.chown(group_of, 0, NOBODY)
        for lease in group_of.iterdir():
            os.chown(lease, 0, NOBODY)
        os.setgroups([NOBODY])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def _tenant_attacks(base: Path, results: Any) -> None:
    """Truncate its seat (refused by the seals), write every word of it, send garbage, and
    truncate the lease file of the folder."""
    outcomes: list[str] = []
    try:
        _become_tenant(base / ".devices")
        client = Client(base / ".node" / SOCKET_NAME)
        outcomes.append("seated")
        try:
            os.ftruncate(client.seat_fd, 0)
            outcomes.append("truncated")
        except OSError as error:
            outcomes.append(error.strerror or "")
        client.seat[:] = b"\xff" * SEAT_SIZE
        client.socket.send(b"scribble")
        with lease_path(base, SIM_GPU0).open("r+b") as lease_file:
            lease_file.truncate(0)
        outcomes.append("file truncated")
    except Exception as error:  # reported to the test, whatever it is
        outcomes.append(f"{type(error).__name__}: {error}")
    results.put(outcomes)


def _as_tenant(target: Callable[..., None], *arguments: object) -> list[str]:
    results = FORK.Queue()
    child = FORK.Process(target=target, args=(*arguments, results))
    child.start()
    outcomes: list[str] = results.get(timeout=60)
    child.join(timeout=60)
    return outcomes


def test_a_tenant_has_a_seat_of_its_own_and_cannot_truncate_it(base: Path) -> None:
    with broker(base) as leases:
        outcomes = _as_tenant(_tenant_attacks, base)
        assert outcomes == ["seated", "Operation not permitted", "file truncated"]
        lease = leases.lease(SIM_GPU0)
        assert lease is not None and os.fstat(lease.fd).st_size == SIZE
        assert lease.word(0) == CONSTANTS["VGPU_LEASE_MAGIC"]  # no tenant maps it
        stats = leases.stats()
        assert stats.refused == 1  # the garbage: that client was dropped
        assert stats.clients == 0


def test_the_arbiter_grants_in_turn_and_takes_the_lease_back(base: Path) -> None:
    """A holder that releases hands over to the waiter; one that stops launching (its seat's
    activity old) loses the lease within the stale time, not the hold time."""
    with broker(base) as leases:
        first, second = Client(leases.path, pod=1), Client(leases.path, pod=2)
        try:
            first.acquire(1)
            assert first.granted(1, 5)
            assert first.word(GRANTED) == 1
            second.acquire(7)
            assert not second.granted(7, 0.002)  # held: it waits
            first.release(1, busy_ns=1000)
            assert second.granted(7, 5)
            assert first.word(GRANTED) == 0 and second.word(GRANTED) == 7
            first.acquire(2)
            started = time.monotonic()
            # The holder writes no activity: stale after VGPU_LEASE_STALE_NS (10 ms).
            assert first.granted(2, 5)
            assert time.monotonic() - started < 0.09
            assert second.word(GRANTED) == 0
            lease = leases.lease(SIM_GPU0)
            assert lease is not None
            assert lease.word(ffi.offsetof("struct vgpu_device_lease", "busy_ns")) == 1000
            assert leases.stats().taken_back == 1
        finally:
            first.close()
            second.close()


NEWCOMER = ffi.offsetof("struct vgpu_lease_seat", "newcomer_ns")


def test_a_pod_that_wakes_is_told_to_the_others_at_most_four_times_in_ten_seconds(
    base: Path,
) -> None:
    """A pod that asks for the lease after a second or more without is a newcomer: the other
    pods' processes are told when (a burst rate written before then did not count it), and the
    daemon is told to make a pass. A party's processes say which pod they are: one that says a
    new pod on every connection is believed four times in ten seconds, no more."""
    with broker(base) as leases:
        busy = Client(leases.path, pod=1)
        clients = [busy]
        try:
            busy.acquire(1)
            assert busy.granted(1, 5)
            first = leases.stats().newcomers
            again = Client(leases.path, pod=1)
            clients.append(again)
            again.acquire(1)  # the same pod again: no newcomer
            time.sleep(0.2)
            assert leases.stats().newcomers == first
            woke = []

            def counted(told: int) -> Callable[[], bool]:
                return lambda: leases.stats().newcomers == told

            for pod in range(2, 8):
                client = Client(leases.path, pod=pod)
                clients.append(client)
                client.acquire(1)
                _until(counted(first + min(pod - 1, 3)), 10, "told")
                time.sleep(0 if pod < 5 else 0.2)  # the seats are told before the count
                woke.append(busy.word(NEWCOMER))
            # This test's processes are one party: its first pod and three more are told.
            assert leases.stats().newcomers == first + 3
            assert woke[0] > 0 and woke[0] < woke[1] < woke[2] == woke[5]
        finally:
            for client in clients:
                client.close()
        # Every connection of the party gone, then a new one for yet another pod: the party
        # keeps its bound (a fresh slot gave it four more each time it connected anew).
        time.sleep(0.2)
        again = Client(leases.path, pod=42)
        try:
            again.acquire(1)
            time.sleep(0.2)
            assert leases.stats().newcomers == first + 3
        finally:
            again.close()


def _hello_again(path: Path, results: Any) -> None:
    """As a tenant: take the lease, then say HELLO again on the same connection."""
    try:
        _become_tenant(path.parent.parent / ".devices")
        client = Client(path, pod=99)
        client.acquire(1)
        granted = client.granted(1, 5)
        client.socket.send(_message("HELLO", value=99, uuid=SIM_GPU0))
        closed = client.socket.recv(MESSAGE_SIZE) == b""
        results.put([f"granted {granted}", f"closed {closed}"])
    except Exception as error:  # reported to the test, whatever it is
        results.put([f"{type(error).__name__}: {error}"])


def test_a_second_hello_from_a_holder_ends_its_hold_and_the_daemon_goes_on(base: Path) -> None:
    """A HELLO on a connection that had one forgot the client's GPU before dropping it: the lease
    stayed with the freed slot, and the next judgement read its seat (NULL): the daemon died of
    SIGSEGV as soon as another process asked for the GPU."""
    with broker(base) as leases:
        other = Client(leases.path, pod=2)  # connected first: the freed slot is not its own
        try:
            outcomes = _as_tenant(_hello_again, leases.path)
            assert outcomes == ["granted True", "closed True"]
            other.acquire(7)
            assert other.granted(7, 5)  # at once: the hold ended with the connection
            assert other.word(GRANTED) == 7
            stats = leases.stats()
            assert stats.refused == 1 and stats.clients == 1
        finally:
            other.close()


def _hello_from_a_stranger(path: Path, results: Any) -> None:
    """As a tenant whose container was not given the GPU: no descriptor of its device."""
    try:
        _become_tenant(path.parent.parent / ".devices")
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stranger.settimeout(10)
        stranger.connect(str(path))
        stranger.send(_message("HELLO", value=99, uuid=SIM_GPU0))
        answer: Any = ffi.from_buffer(MESSAGE + " *", stranger.recv(MESSAGE_SIZE))
        told = answer.kind == CONSTANTS["VGPU_ARBITER_STRANGER"]
        results.put([f"told {told}", f"closed {stranger.recv(MESSAGE_SIZE) == b''}"])
    except Exception as error:  # reported to the test, whatever it is
        results.put([f"{type(error).__name__}: {error}"])


def test_a_process_without_the_gpus_device_open_is_not_served_its_lease(base: Path) -> None:
    """Any local process could say HELLO for any GPU of the node and take turns of its lease,
    idle, from the pods the GPU was given to (75 % of the lease time beside a client of
    another user). A GPU's lease is now served only to a process that holds the GPU's device
    open, as every process with a context there does; /dev/full stands in for /dev/nvidiaN."""
    device = Path("/dev/full").stat().st_rdev
    leases = LeaseBroker(base, [SIM_GPU0], devices={SIM_GPU0: device})
    leases.start()
    try:
        assert _as_tenant(_hello_from_a_stranger, leases.path) == ["told True", "closed True"]
        assert leases.stats().strangers == 1
        with Path("/dev/full").open("rb"):  # a process of the pod: its driver holds the device open
            holder = Client(leases.path, pod=2)
        try:
            holder.acquire(3)
            assert holder.granted(3, 5)
            assert leases.stats().strangers == 1
        finally:
            holder.close()
    finally:
        leases.close()


def _hello_holding_a_path_only(path: Path, results: Any) -> None:
    """As a tenant whose container was not given the GPU but holds an O_PATH descriptor of a
    node of the GPU's device number (a container's root may mknod one, an image may carry one:
    the device cgroup refuses it a real open, not an O_PATH one)."""
    try:
        _become_tenant(path.parent.parent / ".devices")
        node = os.open("/dev/full", os.O_PATH)
        try:
            stranger = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            stranger.settimeout(10)
            stranger.connect(str(path))
            stranger.send(_message("HELLO", value=99, uuid=SIM_GPU0))
            answer: Any = ffi.from_buffer(MESSAGE + " *", stranger.recv(MESSAGE_SIZE))
            results.put([f"told {answer.kind == CONSTANTS['VGPU_ARBITER_STRANGER']}"])
        finally:
            os.close(node)
    except Exception as error:  # reported to the test, whatever it is
        results.put([f"{type(error).__name__}: {error}"])


def test_a_process_holding_the_gpus_device_by_path_only_is_not_served_its_lease(
    base: Path,
) -> None:
    """An O_PATH descriptor opens nothing, yet /proc/PID/fd showed it as the character device
    it names: a tenant with a node of its own making (mknod, a default capability of a
    container's root) took turns of a GPU its pod was not given. Only a descriptor open for
    reading or writing counts."""
    leases = LeaseBroker(base, [SIM_GPU0], devices={SIM_GPU0: Path("/dev/full").stat().st_rdev})
    leases.start()
    try:
        assert _as_tenant(_hello_holding_a_path_only, leases.path) == ["told True"]
        assert leases.stats().strangers == 1
    finally:
        leases.close()


def _hello_kind(path: Path) -> str:
    """Say HELLO on a new connection: the kind of the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.settimeout(10)
        connection.connect(str(path))
        connection.send(_message("HELLO", value=99, uuid=SIM_GPU0))
        data, _, _, _ = socket.recv_fds(connection, MESSAGE_SIZE, 1)
        answer: Any = ffi.from_buffer(MESSAGE + " *", data)
        return "stranger" if answer.kind == CONSTANTS["VGPU_ARBITER_STRANGER"] else "welcome"


def _hello_in_a_loop(path: Path, results: Any) -> None:
    """As a tenant: HELLO without the device, then at once with it, then a second later. The
    second HELLO is refused unlooked only if it came within the second: on a machine so loaded
    that it did not, it is looked at and served, which the test is told."""
    try:
        _become_tenant(path.parent.parent / ".devices")
        started = time.monotonic()
        kinds = [_hello_kind(path)]
        with Path("/dev/full").open("rb"):
            kinds.append(_hello_kind(path))
            within = time.monotonic() - started < 0.9
            time.sleep(1.2)
            kinds.append(_hello_kind(path))
        results.put([*kinds, f"within {within}"])
    except Exception as error:  # reported to the test, whatever it is
        results.put([f"{type(error).__name__}: {error}"])


def test_a_party_refused_a_gpus_lease_is_not_looked_at_again_for_a_second(base: Path) -> None:
    """Each HELLO read up to 1,024 of the process's descriptors (milliseconds for a process of
    many), so a tenant saying HELLO in a loop kept busy the thread that hands every lease over.
    A party refused is refused again without a look for a second; then it is looked at again."""
    leases = LeaseBroker(base, [SIM_GPU0], devices={SIM_GPU0: Path("/dev/full").stat().st_rdev})
    leases.start()
    try:
        outcomes = _as_tenant(_hello_in_a_loop, leases.path)
        if outcomes[-1] == "within True":
            assert outcomes == ["stranger", "stranger", "welcome", "within True"]
            assert leases.stats().strangers == 2
        else:  # the machine took most of a second between two HELLOs: the pause may be over
            assert outcomes[0] == "stranger" and outcomes[2:] == ["welcome", "within False"]
    finally:
        leases.close()


def _hog(path: Path, seconds: float, results: Any) -> None:
    """As a tenant: take the lease over and over and keep it, writing fresh activity into its
    own seats, never releasing, over several connections made again whenever one is dropped;
    and truncate the lease file every millisecond."""
    base = path.parent.parent
    try:
        _become_tenant(base / ".devices")
        clients = [Client(path, pod=99) for _ in range(8)]
        request = connections = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for index, client in enumerate(clients):
                request += 1
                try:
                    client.acquire(request)
                    client.granted(request, 0.0001)  # reads what came, grants included
                except OSError:
                    client.close()
                    clients[index] = Client(path, pod=99)
                    connections += 1
                client.write(ACTIVITY, time.monotonic_ns())
            with lease_path(base, SIM_GPU0).open("r+b") as lease_file:
                lease_file.truncate(0)
            time.sleep(0.001)
        results.put([str(request), str(connections)])
    except Exception as error:  # reported to the test, whatever it is
        results.put([f"{type(error).__name__}: {error}"])


def test_a_tenant_that_hogs_the_lease_costs_other_pods_little(
    base: Path, pods: Callable[[str], dict[str, str]]
) -> None:
    """Before, a tenant writing the shared lease's owner word made a 30 % pod of a 30/70 pair
    pace at 14-17 %. Now it can only hold grants the arbiter gave it: past the hold it loses
    them and is served last for a while."""
    with broker(base) as leases:
        DeviceLease.open(base, SIM_GPU0).close()
        results = FORK.Queue()
        hog = FORK.Process(target=_hog, args=(leases.path, 5.0, results))
        hog.start()
        try:
            low, high = concurrent([limit(pods("a"), 30), limit(pods("b"), 70)])
            print(f"30/70 beside a hog: {low:.1f} / {high:.1f}; {leases.stats()}")
        finally:
            said = results.get(timeout=60)
            hog.join(timeout=60)
        assert said[0].isdigit(), said
        overruns = leases.stats().overruns
        assert overruns >= 1
    # Each overrun held the GPU one hold (100 ms) before the arbiter took it back: the most the
    # hog can cost the pair, in points of the 4-s run, beside the pacing's own tolerance.
    held = 100 * overruns * CONSTANTS["VGPU_LEASE_HOLD_NS"] / 4e9
    for got, share in ((low, 30), (high, 70)):
        assert share - TOLERANCE_PP - 1 - held <= got <= share + TOLERANCE_PP + 1


def test_the_node_file_names_the_arbiter_and_the_socket_is_the_daemons(base: Path) -> None:
    with broker(base) as leases:
        with DeviceLease.open(base, SIM_GPU0) as reader:
            assert reader.lease_instance() == leases.instance
        # Clients that connect and say nothing, or garbage, hold nothing up.
        idle = [socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(50)]
        for index, client in enumerate(idle):
            client.connect(str(leases.path))
            if index % 2:
                client.send(b"\0" * 64)
        answered = Client(leases.path)
        assert answered.instance == leases.instance
        answered.close()
        for client in idle:
            client.close()
    assert not (base / ".node" / SOCKET_NAME).exists()
    assert node_path(base, SIM_GPU0).exists()


@pytest.fixture
def pods(limited_env: LimitedEnv, tmp_path: Path, base: Path) -> Callable[[str], dict[str, str]]:
    def make(pod: str) -> dict[str, str]:
        return limited_env(SHM_BASE_PATH=str(base), SHM_PATH=str(tmp_path / pod))

    return make


def test_a_paced_process_takes_the_lease_of_a_daemon_that_starts_later(
    base: Path, pods: Callable[[str], dict[str, str]]
) -> None:
    """Started before the daemon (a lease file), then through two daemons: within a second of
    each one's start the process paces with its lease, so that it shares one with the pods
    started after it."""
    environment = limit(pods("a"), 50) | {"TF_LOG_LEVEL": "info"}
    process = subprocess.Popen(
        [WORKLOAD, "--duration", "6", "--kernel-us", "500"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        for _ in range(2):
            with broker(base) as leases:
                lease = leases.lease(SIM_GPU0)
                assert lease is not None
                deadline = time.monotonic() + 2.5
                while lease.word(EPOCHS) == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert lease.word(EPOCHS) > 0
    finally:
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert err.count("the daemon's, instance") == 2, err


def test_a_paced_process_not_served_a_gpus_lease_says_why(
    base: Path, pods: Callable[[str], dict[str, str]], tmp_path: Path
) -> None:
    """A paced process that holds no descriptor of the GPU's device (on the simulated GPU none
    does; /dev/full stands in) is told so, and says it, then paces with a lease of its own."""
    leases = LeaseBroker(base, [SIM_GPU0], devices={SIM_GPU0: Path("/dev/full").stat().st_rdev})
    leases.start()
    try:
        done = subprocess.run(
            [WORKLOAD, "--kernels", "200", "--kernel-us", "500"],
            env=limit(pods("a"), 50) | {"TMPDIR": str(tmp_path), "TF_LOG_LEVEL": "info"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert leases.stats().strangers >= 1
    finally:
        leases.close()
    assert done.returncode == 0, done.stderr
    assert "only to processes that hold its device file open" in done.stderr, done.stderr


def _paced_beside_a_flooded_daemon(
    base: Path, environment: dict[str, str], tmp_path: Path
) -> "subprocess.CompletedProcess[str]":
    """About 3 s of paced work (long enough for a few retries of the daemon, every second)
    while the daemon's socket never accepts: its queue is full."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(base / ".node" / SOCKET_NAME))
    listener.listen(0)  # never accepted: its queue fills at once
    queued = []
    for _ in range(8):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            client.connect(str(base / ".node" / SOCKET_NAME))
        queued.append(client)
    try:
        return subprocess.run(
            [WORKLOAD, "--kernels", "1500", "--kernel-us", "1000"],
            env=environment | {"TMPDIR": str(tmp_path), "TF_LOG_LEVEL": "info"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        for client in queued:
            client.close()
        listener.close()


def test_a_daemon_that_does_not_answer_never_sends_pods_to_the_group_lease_file(
    base: Path, pods: Callable[[str], dict[str, str]], tmp_path: Path
) -> None:
    """A flood of connections can keep the daemon from answering for a moment: the process
    then paces with a lease of its own (no other user can truncate it), never with the group's
    lease file, and takes the daemon's once it answers. The node file names the daemon's
    arbiter, as a live daemon's does: a process on a lease of its own goes to the group's file
    only once none is named or nobody listens (after a daemon stopped)."""
    node = DeviceLease.open(base, SIM_GPU0)  # the node folder and the lease file, as a daemon
    node._node.lease_instance = 12345  # what a live daemon's arbiter names itself
    node.close()
    result = _paced_beside_a_flooded_daemon(base, limit(pods("a"), 50), tmp_path)
    assert result.returncode == 0, result.stderr
    (said,) = [
        line for line in result.stderr.splitlines() if "device lease from the daemon" in line
    ]
    assert f"using {tmp_path}/vgpu-devices-" in said, said
    assert "no daemon; using" not in result.stderr
    with lease_path(base, SIM_GPU0).open("rb") as lease_file:
        assert int.from_bytes(lease_file.read()[EPOCHS : EPOCHS + 8], "little") == 0


def test_a_lease_of_its_own_goes_to_the_group_file_when_no_daemon_names_an_arbiter(
    base: Path, pods: Callable[[str], dict[str, str]], tmp_path: Path
) -> None:
    """A socket that does not answer, and a node file that names no daemon's arbiter: nobody
    to wait for. The process that first took a lease of its own joins the group's lease file,
    where processes that found no daemon pace, within a second or two."""
    DeviceLease.open(base, SIM_GPU0).close()  # a node file naming no arbiter
    result = _paced_beside_a_flooded_daemon(base, limit(pods("a"), 50), tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"using {tmp_path}/vgpu-devices-" in result.stderr, result.stderr
    assert f"no daemon; using {base}/.devices" in result.stderr, result.stderr
    assert _epochs(lease_path(base, SIM_GPU0)) > 0


def _until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _epochs(lease: Path) -> int:
    with lease.open("rb") as lease_file:
        return int.from_bytes(lease_file.read()[EPOCHS : EPOCHS + 8], "little")


def test_a_process_that_met_a_daemon_going_away_takes_the_group_lease_file_once_it_is_gone(
    base: Path, pods: Callable[[str], dict[str, str]], tmp_path: Path
) -> None:
    """A daemon going away can accept a connection and close it unanswered. A process whose
    connection ended then meets that and paces with a lease of its own (a daemon that does not
    answer never sends it to the group's file), while a pod that comes once the daemon is gone
    takes the group's lease file. Before, the first stayed on its own lease for as long as no
    daemon came back, and the two pods stopped excluding each other (a 30/70 pair at 13/63 %).
    Now it takes the group's file once it finds no daemon (within a second or two). The
    daemon's going away is staged, not raced: the process is stopped meanwhile."""
    private = tmp_path / f"vgpu-devices-{os.geteuid()}" / lease_path(base, SIM_GPU0).name
    group = lease_path(base, SIM_GPU0)
    socket_path = base / ".node" / SOCKET_NAME
    processes: dict[str, subprocess.Popen[str]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}

    def start(name: str, percent: int) -> subprocess.Popen[str]:
        environment = limit(pods(name), percent) | {
            "TF_LOG_LEVEL": "info",
            "TMPDIR": str(tmp_path),
        }
        with logs[name].open("w") as log:  # a file: a pipe nobody reads could stall it
            processes[name] = subprocess.Popen(
                [WORKLOAD, "--duration", "120", "--kernel-us", "500"],
                env=environment,
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )
        return processes[name]

    try:
        with broker(base) as leases:
            first = start("a", 30)
            arbitrated = leases.lease(SIM_GPU0)
            assert arbitrated is not None
            _until(lambda: arbitrated.word(EPOCHS) > 0, 30, "no epoch under the daemon")
            first.send_signal(signal.SIGSTOP)  # it sees the daemon stop only once it runs
        # The daemon's socket is gone and the node file still names it: a stand-in of the
        # daemon going away accepts the process's connection and closes it unanswered.
        going = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        going.bind(str(socket_path))
        going.listen(8)
        going.settimeout(30)
        first.send_signal(signal.SIGCONT)
        try:
            going.accept()[0].close()
        finally:
            going.close()
            socket_path.unlink()
        said = f"not kept apart: using {private.parent}"
        _until(lambda: said in logs["a"].read_text(), 30, "no lease of its own")
        start("b", 70)  # finds no daemon at all: the group's lease file
        _until(lambda: "no daemon; using" in logs["a"].read_text(), 30, "still on its own")
        assert f"no daemon; using {group.parent}" in logs["a"].read_text()
        # Both pace with the group's file now: the own lease runs no more epochs.
        before = _epochs(private)
        time.sleep(1.0)
        assert _epochs(private) == before
        assert _epochs(group) > 0
        assert "vgpu-devices" not in logs["b"].read_text()
    finally:
        for process in processes.values():
            process.kill()
            process.wait(timeout=60)


def _connections(path: Path, count: int) -> list[socket.socket]:
    """``count`` connections to the arbiter that never say HELLO."""
    made = []
    for _ in range(count):
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        connection.connect(str(path))
        made.append(connection)
    return made


def test_connections_that_never_say_hello_are_dropped(base: Path) -> None:
    """They held their slots for good: enough of them and every paced process of the node paced
    on a lease of its own."""
    with broker(base) as leases:
        held = _connections(leases.path, 20)
        try:
            _until(lambda: leases.stats().clients == 20, 10, "the connections accepted")
            _until(lambda: leases.stats().clients == 0, 20, "the silent ones dropped")
            assert all(connection.recv(1) == b"" for connection in held)  # closed
        finally:
            for connection in held:
                connection.close()


def _can_make_pid_namespaces() -> bool:
    try:
        made = subprocess.run(["unshare", "--pid", "--fork", "true"], check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return made.returncode == 0


@pytest.mark.skipif(
    os.geteuid() != 0 or not _can_make_pid_namespaces(), reason="needs to make pid namespaces"
)
def test_a_user_in_pid_namespaces_of_its_own_holds_half_the_connections_at_most(
    base: Path,
) -> None:
    """A party is a user in a pid namespace: a user that made four (unshare -Urp) held all 1024
    connections. Now a user's parties hold 512 together."""
    program = (
        "import socket, sys, time\n"
        "held = []\n"
        "for _ in range(256):\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "    s.connect(sys.argv[1])\n"
        "    held.append(s)\n"
        "print('connected', flush=True)\n"
        "time.sleep(30)\n"
    )
    with broker(base) as leases:
        holders = [
            subprocess.Popen(
                ["unshare", "--pid", "--fork", sys.executable, "-c", program, str(leases.path)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        try:
            for holder in holders:
                assert holder.stdout is not None and holder.stdout.readline() == "connected\n"
            _until(lambda: leases.stats().clients == 512, 10, "two parties' connections")
            time.sleep(0.5)
            assert leases.stats().clients == 512
            assert leases.stats().refused >= 256
        finally:
            for holder in holders:
                holder.kill()
                holder.wait()
