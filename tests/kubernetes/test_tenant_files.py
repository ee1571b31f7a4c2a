"""The daemon never follows, reads or blocks on a file a tenant put in its pod folder, and
SIGTERM always stops it.

Before, the pod source kept a ``kubernetes-pod`` file with the pod's UID in the pod's folder,
which the pod's tenant can write, and wrote and read it as root following links: a symbolic
link there to another pod's region, and any change to the tenant's own pod, made the daemon
overwrite that region (299,952 → 37 bytes; its workers died of SIGBUS); a FIFO there hung the
pod source for the whole node (a pod created later got no region) and then the daemon ignored
SIGTERM. Now nothing the daemon writes lives in a pod folder (pod_book.py).

The files are planted as the tenant would: by a real non-root user (nobody) when the suite runs
as root, given the pod folder (a container running as root can write the folder of a pod made
for root's processes, root 0770; a folder an earlier version gave a tenant is still the
tenant's), and reaching it only through a descriptor, as a container reaches its mounted pod
folder. Without root, the suite's own user plants them (the daemon then runs as that user too;
what is shown is the same: the daemon does not follow or open them).
"""

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon.service import STOP_GRACE_S
from vgpu_hypervisor.kubernetes.pod_book import OLD_MARKER
from vgpu_limiter import region as regions

from tests.hypervisor.conftest import Daemon, wait_for
from tests.kubernetes.test_pod_source import VRAM, _limits, _log, daemon
from tests.support.apiserver import ApiServer

__all__ = ["daemon"]

GiB = 1 << 30
MiB = 1 << 20
NOBODY = 65534
GPU_IDS = "tensor-fusion.ai/gpu-ids"


def as_tenant(folder: Path, plant: Callable[[int], None]) -> None:
    """``plant(folder_fd)`` run by the pod's tenant in a child process."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if os.geteuid() == 0:
            os.chown(fd, NOBODY, NOBODY)  # the folder is the tenant's to write
        child = os.fork()
        if child == 0:  # pragma: no cover (the child's status is checked below)
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
                plant(fd)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the tenant could not plant its file"
    finally:
        os.close(fd)


def _replacing(name: str, make: Callable[[str, int], None]) -> Callable[[int], None]:
    """The tenant's move: whatever is at ``name`` in its folder (an earlier version's marker)
    removed, and ``make(name, folder_fd)`` put there instead."""

    def plant(fd: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
        make(name, fd)

    return plant


def region_words(path: Path, *, rewrites: bool = False) -> bytes:
    """A region's bytes but the scheduler words of its GPU entries, which the daemon stamps at
    every pass (each pod's effective compute limit and when it was published); with
    ``rewrites``, the limits' generation too (counting the daemon's rewrites of the same
    limits, as a restart does for every pod)."""
    data = bytearray(path.read_bytes())
    ffi = regions.ffi
    devices = ffi.offsetof("struct vgpu_region", "devices")
    entry = ffi.sizeof("struct vgpu_region_device")
    masked = [("scheduler_state", ffi.sizeof("uint64_t[8]"))]
    masked += [("generation", ffi.sizeof("uint32_t"))] if rewrites else []
    for index in range(ffi.sizeof("struct vgpu_region_device[16]") // entry):
        for word, size in masked:
            start = devices + index * entry + ffi.offsetof("struct vgpu_region_device", word)
            data[start : start + size] = bytes(size)
    return bytes(data)


def _book(daemon: Daemon) -> Path:
    return daemon.base / ".kubernetes" / "pods.json"


@pytest.fixture
def stopped_in_time() -> Iterator[list[float]]:
    """How long each SIGTERM took to end a daemon (appended by the test)."""
    taken: list[float] = []
    yield taken
    assert all(seconds < STOP_GRACE_S + 10 for seconds in taken), taken


def _terminate(daemon: Daemon) -> tuple[int, float]:
    assert daemon.process is not None
    started = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    code = daemon.process.wait(timeout=STOP_GRACE_S + 20)
    taken = time.monotonic() - started
    if daemon.process.stderr:
        daemon.process.stderr.close()
    daemon.process = None
    return code, taken


def test_a_link_in_a_pod_folder_never_makes_the_daemon_write_another_pods_region(
    daemon: Daemon, api: ApiServer
) -> None:
    api.put_pod("victim", annotations={VRAM: "2Gi", GPU_IDS: "0"})
    api.put_pod("evil", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "victim") == (2 * GiB, None), timeout=15)
    assert wait_for(lambda: _limits(daemon, "evil") == (1 * GiB, None), timeout=15)
    victim = daemon.base / "default" / "victim" / regions.REGION_FILE
    evil = daemon.base / "default" / "evil"
    before, limits_before = region_words(victim), region_words(victim, rewrites=True)
    assert len(before) == regions.REGION_SIZE

    # The attack: the old marker's name made a link to the victim's region, then any change to
    # the tenant's own pod (here its annotations, which a tenant may patch).
    as_tenant(evil, _replacing(OLD_MARKER, lambda name, fd: os.symlink(victim, name, dir_fd=fd)))
    api.put_pod("evil", annotations={VRAM: "512Mi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "evil") == (512 * MiB, None), timeout=15)
    assert region_words(victim) == before

    # And as an upgrade finds it: a daemon that never saw the pod, a link where an earlier
    # version's marker was. It is unlinked (the link, not its target), never followed.
    daemon.stop()
    _book(daemon).unlink(missing_ok=True)
    daemon.start()
    api.put_pod("evil", annotations={VRAM: "256Mi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "evil") == (256 * MiB, None), timeout=15)
    assert wait_for(lambda: not os.path.lexists(evil / OLD_MARKER), timeout=15)

    assert region_words(victim, rewrites=True) == limits_before
    assert _limits(daemon, "victim") == (2 * GiB, None)
    assert (daemon.base / "default" / "victim").stat().st_uid == os.geteuid()
    assert " failed" not in _log(daemon)


def test_a_fifo_in_a_pod_folder_blocks_nothing_and_sigterm_stops_the_daemon(
    daemon: Daemon, api: ApiServer, stopped_in_time: list[float]
) -> None:
    api.put_pod("evil", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "evil") == (1 * GiB, None), timeout=15)
    evil = daemon.base / "default" / "evil"
    for name in (OLD_MARKER, "shm.tmp", ".kubernetes", "pods.json"):  # any name, for good measure
        as_tenant(evil, _replacing(name, lambda name, fd: os.mkfifo(name, dir_fd=fd)))

    api.put_pod("evil", annotations={VRAM: "512Mi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "evil") == (512 * MiB, None), timeout=15)
    # A pod created afterwards gets its region: the pod source is not held up.
    api.put_pod("later", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "later") == (1 * GiB, None), timeout=15)

    # A restart finds it as an upgrade would: unlinked unread, nothing blocks.
    code, taken = _terminate(daemon)
    stopped_in_time.append(taken)
    assert code == 0
    _book(daemon).unlink(missing_ok=True)
    daemon.start()
    api.put_pod("evil", annotations={VRAM: "256Mi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "evil") == (256 * MiB, None), timeout=15)
    assert wait_for(lambda: not os.path.lexists(evil / OLD_MARKER), timeout=15)
    api.put_pod("last", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "last") == (1 * GiB, None), timeout=15)
    code, taken = _terminate(daemon)
    stopped_in_time.append(taken)
    assert code == 0


def test_sigterm_stops_the_daemon_in_time_whatever_thread_is_stuck(
    tmp_path: Path, stopped_in_time: list[float]
) -> None:
    """A worker thread that never returns (here the metrics file, made a FIFO nobody reads:
    opening it to write waits for a reader) cannot be cancelled, and Python waits for such
    threads at exit: the daemon ends at its deadline anyway, saying which threads it left."""
    daemon = Daemon(tmp_path)
    os.mkfifo(daemon.metrics_file)
    daemon.start()
    try:
        code, taken = _terminate(daemon)
    finally:
        daemon.close()
    stopped_in_time.append(taken)
    log = _log(daemon)
    assert "SIGTERM received" in log
    if code != 0:  # while the metrics file opens that way: the deadline ended the process
        assert code == 1
        assert f"still stopping {STOP_GRACE_S:g} s after the signal" in log
        assert "exiting without the threads still running" in log
