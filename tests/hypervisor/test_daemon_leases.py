"""The daemon arbitrates every GPU's lease: its paced pods take their leases from it, a truncated
lease file kills nobody, and a daemon started again arbitrates anew, running processes with it."""

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon import leases
from vgpu_hypervisor.gpu import backend
from vgpu_limiter.lease import DeviceLease, lease_path
from vgpu_limiter.lease_broker import SOCKET_NAME, LeaseBroker

from tests.hypervisor.conftest import Daemon, Said
from tests.limiter.conftest import WORKLOAD
from tests.support.arbiter import OTHER_POD_HOLDS, SIM_GPU0, Client


def _instance(daemon: Daemon) -> int:
    """The arbiter that GPU 0's node file names."""
    with DeviceLease.open(daemon.base, SIM_GPU0) as reader:
        return reader.lease_instance()


def _watch_held(daemon: Daemon) -> bool:
    """Whether the arbiter says another pod holds GPU 0's lease within a few seconds, as seen
    from a seat of a pod of no process."""
    watcher = Client(daemon.base / ".node" / SOCKET_NAME, pod=0xC0FFEE)
    try:
        assert watcher.instance == _instance(daemon)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if watcher.word(OTHER_POD_HOLDS) == 1:
                return True
            time.sleep(0.002)
        return False
    finally:
        watcher.close()


def test_paced_pods_take_the_daemons_lease_and_survive_a_truncated_lease_file(
    daemon: Daemon,
) -> None:
    created = daemon.cli("pods", "create", "a", "--compute", "0=50")
    assert created.returncode == 0, created.stderr
    second = Client(
        daemon.base / ".node" / SOCKET_NAME, uuid="GPU-5157a1e0-0000-4000-8000-000000000002"
    )
    second.close()  # the daemon arbitrates both simulated GPUs
    process = daemon.workload("a", "--duration", "3", "--kernel-us", "500")
    assert _watch_held(daemon)
    # What killed every paced process of the GPU with SIGBUS when they mapped the file.
    lease_path(daemon.base, SIM_GPU0).open("r+b").truncate(0)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "device lease" not in err  # no fallback, no refusal


def test_running_processes_take_the_lease_of_a_daemon_started_again(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "a", "--compute", "0=50")
    assert created.returncode == 0, created.stderr
    # Ended once the new daemon's lease is seen held: a fixed 6 s ran out before a daemon
    # restarted on a loaded machine was serving, and no process was left to take its lease.
    process = subprocess.Popen(
        [WORKLOAD, "--duration", "120", "--kernel-us", "500"],
        env=daemon.workload_environment("a", TF_LOG_LEVEL="info"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        first = _instance(daemon)
        assert daemon.stop() == 0
        daemon.start()
        instance = _instance(daemon)
        assert instance != first
        assert _watch_held(daemon)
    finally:
        process.terminate()
    _, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM, err
    assert "the daemon stopped arbitrating it" in err, err
    assert err.count(f"the daemon's, instance {instance}") == 1, err


def test_a_second_daemon_on_the_same_base_leaves_the_first_ones_leases_alone(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Before, it replaced the socket and the node files' instances, and a failing start left
    the node naming leases nobody handed out. It now stops before it arbitrates anything: one
    daemon serves a base path (test_daemon_restart.py)."""
    instance = _instance(daemon)
    second = Daemon(tmp_path / "second")
    second.base = daemon.base
    try:
        with pytest.raises(AssertionError, match=r"another daemon .* serves the base path"):
            second.start()
    finally:
        second.close()
    assert Client(daemon.base / ".node" / SOCKET_NAME).instance == instance
    assert _instance(daemon) == instance


def test_the_daemon_publishes_its_context_charge_in_every_node_file(daemon: Daemon) -> None:
    for uuid in (SIM_GPU0, "GPU-5157a1e0-0000-4000-8000-000000000002"):
        with DeviceLease.open(daemon.base, uuid) as reader:
            assert reader.context_charge() == 512 << 20  # the test daemon's --context-charge


def test_each_real_gpus_lease_is_tied_to_its_device_and_a_simulated_ones_to_none() -> None:
    """The daemon ties each GPU's lease to the GPU's /dev/nvidiaN (arbiter: a process is served
    only while it holds it open); the simulated GPU has no device file, so its leases are
    served to any process that connects."""
    info = backend.start(simulate=True)
    try:
        simulated = leases.gpu_devices(info)
        real = leases.gpu_devices(dataclasses.replace(info, backend="nvml"))
    finally:
        backend.stop()
    assert simulated and set(simulated.values()) == {None}
    assert list(real) == list(simulated)
    for device in real.values():  # the driver's major; the minor as NVML says
        assert device is not None and os.major(device) == leases.NVIDIA_MAJOR


def test_a_gpus_device_number_is_its_files_where_the_daemon_sees_it() -> None:
    node = Path("/dev/nvidia7")
    assert leases.device_number(7) == (node.stat().st_rdev if node.exists() else os.makedev(195, 7))


def test_processes_refused_a_gpus_lease_are_said_once_each(tmp_path: Path) -> None:
    """The daemon says how many requests were refused since it last said (a tenant trying a
    GPU its pod was not given, or a daemon that cannot read their /proc/PID/fd), and no more."""
    broker = LeaseBroker(tmp_path, [SIM_GPU0], devices={SIM_GPU0: Path("/dev/full").stat().st_rdev})
    broker.start()
    said = Said()
    logging.getLogger("vgpu_hypervisor").addHandler(said)
    try:
        watch = leases.StrangerWatch(broker)
        for _ in range(2):
            with contextlib.suppress(AssertionError):  # told, then dropped: no seat
                Client(broker.path)
        watch.tick()
        watch.tick()
    finally:
        logging.getLogger("vgpu_hypervisor").removeHandler(said)
        broker.close()
    refused = [line for line in said.lines if "without holding the GPU's device file" in line]
    # Two HELLOs of this one process: counted as requests (a refused process asks each second)
    assert len(refused) == 1 and refused[0].startswith("2 request(s)"), said.lines
