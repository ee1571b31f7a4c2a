"""The daemon's sealed device leases (lease_broker.py): handed out over {base}/.node/leases.sock,
taken by every paced process, impossible to truncate, repaired when scribbled, and followed when
the daemon starts again. The attacks are those of a tenant in the lease group: where the suite
runs as root they run as the unprivileged user `nobody` (uid 65534), elsewhere as the suite's
own user, which is no more privileged than a tenant either."""

import contextlib
import mmap
import os
import socket
import subprocess
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


def _leases_from(path: Path) -> tuple[bytes, list[int]]:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(path))
    with client:
        message, fds, _, _ = socket.recv_fds(client, 4096, 16)
    return message, fds


def _tenant_attacks(base: Path, results: Any) -> None:
    """Truncate the daemon's lease (refused by its seals), scribble its header, and truncate the
    lease file of the folder. (What writing the lease's other words can do, and why it is
    bounded, test_lease_adversary.py shows.)"""
    outcomes: list[str] = []
    try:
        _become_tenant(base / ".devices")
        message, fds = _leases_from(base / ".node" / SOCKET_NAME)
        outcomes.append(message.decode().splitlines()[0])
        try:
            os.ftruncate(fds[0], 0)
            outcomes.append("truncated")
        except OSError as error:
            outcomes.append(error.strerror or "")
        with mmap.mmap(fds[0], SIZE) as view:
            # The 8-byte write that once sent every pod to a lease of its own, for good.
            view[0:8] = b"scribble"
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


def test_the_daemons_lease_cannot_be_truncated_and_a_scribbled_header_is_repaired(
    base: Path,
) -> None:
    with broker(base) as leases:
        outcomes = _as_tenant(_tenant_attacks, base)
        assert outcomes == ["vgpu-leases 1", "Operation not permitted", "file truncated"]
        lease = leases.lease(SIM_GPU0)
        assert lease is not None and os.fstat(lease.fd).st_size == SIZE
        assert leases.repair() == [SIM_GPU0]
        assert lease.word(0) == CONSTANTS["VGPU_LEASE_MAGIC"]
        assert leases.repair() == []


def test_the_node_file_names_the_lease_and_the_socket_is_the_daemons(base: Path) -> None:
    with broker(base) as leases:
        lease = leases.lease(SIM_GPU0)
        assert lease is not None
        with DeviceLease.open(base, SIM_GPU0) as reader:
            assert reader.lease_instance() == lease.instance
        message, fds = _leases_from(base / ".node" / SOCKET_NAME)
        for fd in fds:
            os.close(fd)
        assert message == f"vgpu-leases 1\n{SIM_GPU0} {lease.instance}\n".encode()
        # A client that connects and says nothing, or garbage, holds nothing up.
        idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(50)]
        for client in idle:
            client.connect(str(leases.path))
            with contextlib.suppress(OSError):  # answered and closed already, maybe
                client.send(b"\0" * 64)
        assert _leases_from(leases.path)[0].startswith(b"vgpu-leases 1\n")
        for client in idle:
            client.close()
    assert not (base / ".node" / SOCKET_NAME).exists()
    assert node_path(base, SIM_GPU0).exists()


@pytest.fixture
def pods(limited_env: LimitedEnv, tmp_path: Path, base: Path) -> Callable[[str], dict[str, str]]:
    def make(pod: str) -> dict[str, str]:
        return limited_env(SHM_BASE_PATH=str(base), SHM_PATH=str(tmp_path / pod))

    return make


def _attack_while(base: Path, seconds: float, results: Any) -> None:
    """The tenant's attacks over and over (as `nobody` where the suite is root)."""
    _become_tenant(base / ".devices")
    count = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _tenant_attacks(base, _Discard())
        count += 1
        time.sleep(0.005)
    results.put([str(count)])


class _Discard:
    def put(self, _: object) -> None:
        pass


def test_pods_keep_their_shares_while_a_tenant_truncates_and_scribbles(
    base: Path, pods: Callable[[str], dict[str, str]]
) -> None:
    """Before, one `truncate -s 0` of the lease killed every paced process with SIGBUS, and one
    scribbled header sent every pod started later to a lease of its own, for good."""
    DeviceLease.open(base, SIM_GPU0).close()  # the lease file too, as a daemon makes it
    with broker(base) as leases:
        results = FORK.Queue()
        attacker = FORK.Process(target=_attack_while, args=(base, 5.0, results))
        attacker.start()
        try:
            low, high = concurrent([limit(pods("a"), 30), limit(pods("b"), 70)])
            print(f"30/70 under attack: {low:.1f} / {high:.1f}")
        finally:
            attacks = int(results.get(timeout=60)[0])
            attacker.join(timeout=60)
        lease = leases.lease(SIM_GPU0)
        assert lease is not None and lease.word(EPOCHS) > 0  # the pods paced with this lease
    assert attacks > 10
    assert low == pytest.approx(30, abs=TOLERANCE_PP + 1)
    assert high == pytest.approx(70, abs=TOLERANCE_PP + 1)


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


def test_a_daemon_that_does_not_answer_never_sends_pods_to_the_group_lease_file(
    base: Path, pods: Callable[[str], dict[str, str]], tmp_path: Path
) -> None:
    """A flood of connections can keep the daemon from answering for a moment: the process
    then paces with a lease of its own (no other user can truncate it), never with the group's
    lease file, and takes the daemon's once it answers."""
    DeviceLease.open(base, SIM_GPU0).close()  # the node folder and the lease file, as a daemon
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(base / ".node" / SOCKET_NAME))
    listener.listen(0)  # never accepted: its queue fills at once
    queued = []
    for _ in range(8):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            client.connect(str(base / ".node" / SOCKET_NAME))
        queued.append(client)
    environment = limit(pods("a"), 50) | {"TMPDIR": str(tmp_path)}
    try:
        result = subprocess.run(
            [WORKLOAD, "--kernels", "20", "--kernel-us", "1000"],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        for client in queued:
            client.close()
        listener.close()
    assert result.returncode == 0, result.stderr
    (said,) = [
        line for line in result.stderr.splitlines() if "device lease from the daemon" in line
    ]
    assert f"using {tmp_path}/vgpu-devices-" in said, said
    with lease_path(base, SIM_GPU0).open("rb") as lease_file:
        assert int.from_bytes(lease_file.read()[EPOCHS : EPOCHS + 8], "little") == 0
