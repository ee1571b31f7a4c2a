"""The daemon hands out sealed device leases: its paced pods take them, a truncated lease file
kills nobody, a scribbled header is stamped again, and a daemon started again hands out new
leases that running processes take."""

import mmap
import socket
import subprocess
import time
from pathlib import Path

from vgpu_limiter.lease import DeviceLease, lease_path
from vgpu_limiter.lease_broker import SOCKET_NAME
from vgpu_limiter.region import CONSTANTS, ffi

from tests.hypervisor.conftest import Daemon, wait_for
from tests.limiter.conftest import WORKLOAD

SIM_GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"
EPOCHS = ffi.offsetof("struct vgpu_device_lease", "epochs")
SIZE = ffi.sizeof("struct vgpu_device_lease")


def _leases(daemon: Daemon) -> dict[str, tuple[int, int]]:
    """The daemon's answer: by GPU, its lease instance and descriptor."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(daemon.base / ".node" / SOCKET_NAME))
    with client:
        message, fds, _, _ = socket.recv_fds(client, 4096, 16)
    lines = message.decode().splitlines()
    assert lines[0] == "vgpu-leases 1"
    answer = {}
    for line, fd in zip(lines[1:], fds, strict=True):
        uuid, instance = line.split()
        answer[uuid] = (int(instance), fd)
    return answer


def _epochs(fd: int) -> int:
    with mmap.mmap(fd, SIZE) as view:
        return int.from_bytes(view[EPOCHS : EPOCHS + 8], "little")


def test_paced_pods_take_the_daemons_lease_and_survive_a_truncated_lease_file(
    daemon: Daemon,
) -> None:
    created = daemon.cli("pods", "create", "a", "--compute", "0=50")
    assert created.returncode == 0, created.stderr
    leases = _leases(daemon)
    assert sorted(leases) == [SIM_GPU0, "GPU-5157a1e0-0000-4000-8000-000000000002"]
    instance, fd = leases[SIM_GPU0]
    with DeviceLease.open(daemon.base, SIM_GPU0) as reader:
        assert reader.lease_instance() == instance
    process = daemon.workload("a", "--duration", "3", "--kernel-us", "500")
    wait_for(lambda: _epochs(fd) > 0, timeout=20)
    # What killed every paced process of the GPU with SIGBUS when they mapped the file.
    lease_path(daemon.base, SIM_GPU0).open("r+b").truncate(0)
    with mmap.mmap(fd, SIZE) as view:
        view[0:8] = b"scribble"
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "device lease" not in err  # no fallback, no refusal
    wait_for(lambda: "stamped again" in daemon.log_file.read_text(), timeout=10)
    with mmap.mmap(fd, SIZE) as view:
        assert int.from_bytes(view[0:8], "little") == CONSTANTS["VGPU_LEASE_MAGIC"]


def test_running_processes_take_the_lease_of_a_daemon_started_again(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "a", "--compute", "0=50")
    assert created.returncode == 0, created.stderr
    process = subprocess.Popen(
        [WORKLOAD, "--duration", "6", "--kernel-us", "500"],
        env=daemon.workload_environment("a", TF_LOG_LEVEL="info"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    assert daemon.stop() == 0
    daemon.start()
    instance, fd = _leases(daemon)[SIM_GPU0]
    wait_for(lambda: _epochs(fd) > 0, timeout=20)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert err.count(f"the daemon's, instance {instance}") == 1, err


def test_a_second_daemon_on_the_same_base_leaves_the_first_ones_leases_alone(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Before, it replaced the socket and the node files' instances, and a failing start left
    the node naming leases nobody handed out."""
    instance, _ = _leases(daemon)[SIM_GPU0]
    second = Daemon(tmp_path / "second")
    second.base = daemon.base
    second.start()
    try:
        wait_for(lambda: "another daemon hands out leases here" in second.log_file.read_text())
    finally:
        second.close()
    assert _leases(daemon)[SIM_GPU0][0] == instance
    with DeviceLease.open(daemon.base, SIM_GPU0) as reader:
        assert reader.lease_instance() == instance
