"""Region files no tenant can abuse, and no SIGBUS: planted links and FIFOs, other users, a full
disk, a file truncated under the daemon (issue 18 items 2, 3 and 6)."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodConflict, PodStore
from vgpu_limiter import region as regions
from vgpu_limiter.region import Region, RegionError

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run
from tests.limiter.test_region import FORK, UUIDS, GiB, one_line
from tests.support.tenant import readable_folder

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


def make(base: Path, namespace: str, pod: str, memory: int = 4 * GiB) -> Region:
    return regions.create_region(
        regions.region_path(base, namespace, pod), namespace, pod, {UUIDS[0]: (memory, 5000)}
    )


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return tmp_path / "base"


# Planted files


def test_a_symlinked_region_is_refused_and_the_daemon_leaves_the_victim_alone(base: Path) -> None:
    make(base, "ns", "victim").close()
    evil = regions.region_path(base, "ns", "evil")
    evil.parent.mkdir(parents=True)
    evil.symlink_to(regions.region_path(base, "ns", "victim"))
    with pytest.raises(RegionError, match="a symbolic link, not a pod region") as caught:
        regions.open_region(evil)
    one_line(caught.value)
    store = PodStore(base)
    try:
        with pytest.raises(PodConflict, match="symbolic link"):
            store.update("ns", "evil", {UUIDS[0]: GpuLimits.change(memory=80 * GiB)})
        assert store.get("ns", "evil").error is not None
        assert store.get("ns", "victim").devices[0].memory_limit == 4 * GiB
    finally:
        store.close()


def test_a_pod_process_holding_the_writers_lock_costs_the_daemon_a_tenth_of_a_second(
    base: Path,
) -> None:
    """A process of the pod may hold flock on its region for as long as it likes: the daemon's
    writes there fail after a short wait (and at once for a while after), one line, and the
    other pods' changes go on. Blocked on the lock, the daemon stopped every pass and every API
    change of the node until the tenant let go."""
    make(base, "ns", "evil").close()
    make(base, "ns", "other").close()
    store = PodStore(base)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            "f = open(sys.argv[1], 'rb')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(60)",
            str(regions.region_path(base, "ns", "evil")),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        with pytest.raises(PodConflict, match="writers' lock is held by another process") as err:
            store.update("ns", "evil", {UUIDS[0]: GpuLimits.change(memory=2 * GiB)})
        one_line(err.value)
        waited = time.monotonic() - began
        assert waited >= regions.WRITERS_LOCK_WAIT_S
        began = time.monotonic()
        with pytest.raises(PodConflict):  # shunned: no wait this time
            store.update("ns", "evil", {UUIDS[0]: GpuLimits.change(memory=2 * GiB)})
        assert time.monotonic() - began < regions.WRITERS_LOCK_WAIT_S
        store.update("ns", "other", {UUIDS[0]: GpuLimits.change(memory=2 * GiB)})
        assert store.get("ns", "other").devices[0].memory_limit == 2 * GiB
        assert store.get("ns", "evil").devices[0].memory_limit == 4 * GiB
    finally:
        holder.kill()
        holder.wait()
    # Let go: the next change goes through (one try while shunned, which finds it free).
    store.update("ns", "evil", {UUIDS[0]: GpuLimits.change(memory=2 * GiB)})
    assert store.get("ns", "evil").devices[0].memory_limit == 2 * GiB
    store.close()


def test_a_folder_where_the_region_goes_is_refused_and_deleted_with_the_pod(base: Path) -> None:
    """A pod whose region path is a folder could never be deleted ("Is a directory")."""
    regions.region_path(base, "ns", "odd").mkdir(parents=True)
    store = PodStore(base)
    try:
        assert store.get("ns", "odd").error is not None
        store.delete("ns", "odd", force=True)
        assert not (base / "ns" / "odd").exists()
    finally:
        store.close()


def test_a_symlinked_pod_folder_is_refused(base: Path) -> None:
    make(base, "ns", "victim").close()
    (base / "ns" / "evil").symlink_to(base / "ns" / "victim")
    with pytest.raises(RegionError, match="not a directory"):
        regions.open_region(regions.region_path(base, "ns", "evil"))


@pytest.mark.parametrize("writable", [True, False])
def test_a_fifo_neither_blocks_nor_is_used(base: Path, writable: bool) -> None:
    path = regions.region_path(base, "ns", "pod")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    started = time.monotonic()
    with pytest.raises(RegionError, match="not a regular file"):
        regions.open_region(path, writable=writable)
    assert time.monotonic() - started < 5


def test_world_writable_files_and_folders_are_refused(base: Path) -> None:
    make(base, "ns", "pod").close()
    path = regions.region_path(base, "ns", "pod")
    path.chmod(0o666)
    with pytest.raises(RegionError, match="writable by every user"):
        regions.open_region(path)
    path.chmod(0o660)
    path.parent.chmod(0o777)
    with pytest.raises(RegionError, match="pod folder is writable by every user"):
        regions.open_region(path)


def test_a_hard_link_to_another_pods_region_is_refused(base: Path) -> None:
    """In a folder its tenant can write (its own, or one its group may write)."""
    make(base, "ns", "victim").close()
    evil = regions.region_path(base, "ns", "evil")
    evil.parent.mkdir(parents=True)
    os.link(regions.region_path(base, "ns", "victim"), evil)
    for owner, group, mode in ((NOBODY, NOBODY, 0o755), (0, NOBODY, 0o775)):
        os.chown(evil.parent, owner, group)
        evil.parent.chmod(mode)
        with pytest.raises(RegionError, match="other hard links"):
            regions.open_region(evil)


def test_the_daemons_own_links_in_folders_only_root_writes_are_used(base: Path) -> None:
    """The device plugin's allocation folders: root's, writable by root alone, so every name in
    them is the daemon's; there a pod's region is linked once per container bound to it."""
    make(base, "ns", "pod").close()
    allocation = base / ".allocations" / "a1"
    allocation.mkdir(parents=True, mode=0o755)
    os.link(regions.region_path(base, "ns", "pod"), allocation / "shm")
    for folder in (allocation, regions.region_path(base, "ns", "pod").parent):
        assert (folder.stat().st_uid, folder.stat().st_mode & 0o002) == (0, 0)  # 0770 root:root
        with regions.open_region(folder / "shm") as region:
            assert (region.namespace, region.pod) == ("ns", "pod")


# Other users


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A base path another user can reach."""
    with readable_folder("vgpu-region-") as folder:
        yield folder / "base"


def _as_nobody(path: Path, results: Any) -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    outcomes = []
    for writable in (True, False):
        try:
            regions.open_region(path, writable=writable).close()
            outcomes.append("opened")
        except RegionError as error:
            outcomes.append(str(error))
    try:
        (path.parent / "planted").write_bytes(b"")
        outcomes.append("planted")
    except OSError as error:
        outcomes.append(error.strerror or "")
    results.put(outcomes)


@needs_root
def test_another_user_can_neither_read_nor_change_a_pod(shared_base: Path) -> None:
    make(shared_base, "ns", "pod").close()
    path = regions.region_path(shared_base, "ns", "pod")
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o660, 0o770)
    assert (shared_base / "ns").stat().st_mode & 0o777 == 0o755
    results = FORK.Queue()
    child = FORK.Process(target=_as_nobody, args=(path, results))
    child.start()
    outcomes = results.get(timeout=30)
    child.join(timeout=30)
    assert all("Permission denied" in outcome for outcome in outcomes), outcomes


@needs_root
def test_a_pod_of_another_user_is_theirs(shared_base: Path) -> None:
    path = regions.region_path(shared_base, "ns", "pod")
    regions.create_region(path, "ns", "pod", owner=NOBODY, group=NOBODY).close()
    assert (path.stat().st_uid, path.stat().st_gid) == (NOBODY, NOBODY)
    # The folder stays its creator's: the tenant can neither remove the region made for it nor
    # plant one of its own choosing (with limits of its own) in its place.
    folder = path.parent.stat()
    assert (folder.st_uid, folder.st_gid, folder.st_mode & 0o7777) == (0, NOBODY, 0o755)
    results = FORK.Queue()
    child = FORK.Process(target=_as_nobody, args=(path, results))
    child.start()
    assert results.get(timeout=30) == ["opened", "opened", "Permission denied"]
    child.join(timeout=30)
    assert path.exists()


# The private folder of standalone processes


def _private_run(limited_env: LimitedEnv, tmp: Path) -> subprocess.CompletedProcess[str]:
    environment = limited_env('{"0": "2GiB"}') | {"TMPDIR": str(tmp)}
    environment.pop("SHM_PATH")
    return run([WORKLOAD, "--kernels", "1"], environment)


def test_the_private_folder_is_made_0700(limited_env: LimitedEnv, tmp_path: Path) -> None:
    result = _private_run(limited_env, tmp_path)
    assert result.returncode == 0, result.stderr
    folder = tmp_path / f"vgpu-{os.getuid()}"
    assert folder.stat().st_mode & 0o777 == 0o700


def _made_instead(tmp: Path) -> Path:
    (made,) = tmp.glob(f"vgpu-{os.getuid()}-*")
    assert made.stat().st_mode & 0o777 == 0o700 and made.stat().st_uid == os.getuid()
    assert [path.name.startswith("private-") for path in made.iterdir()] == [True]
    return made


def test_a_planted_private_folder_is_never_used(limited_env: LimitedEnv, tmp_path: Path) -> None:
    """Anyone can make names in TMPDIR: a link planted where this user's folder goes is not
    followed, and the program runs with a folder of an unguessable name instead (before, every
    CUDA program of the user failed to start)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / f"vgpu-{os.getuid()}").symlink_to(elsewhere)
    result = _private_run(limited_env, tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert "symbolic link" in line and str(_made_instead(tmp_path)) in line, line
    assert list(elsewhere.iterdir()) == []


@needs_root
def test_someone_elses_private_folder_is_never_used(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    folder = tmp_path / f"vgpu-{os.getuid()}"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    result = _private_run(limited_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "must be this user's" in result.stderr and str(_made_instead(tmp_path)) in result.stderr
    assert list(folder.iterdir()) == []


def test_a_private_folder_that_cannot_be_made_is_one_line(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    missing = tmp_path / "missing"
    result = _private_run(limited_env, missing)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert "cannot create the private folder" in line, line


# A full disk


def test_a_full_disk_is_one_line_and_leaves_nothing(small_disk: Path) -> None:
    path = regions.region_path(small_disk, "ns", "pod")
    with pytest.raises(RegionError, match="No space left on device") as caught:
        regions.create_region(path, "ns", "pod", {UUIDS[0]: (GiB, 0)})
    one_line(caught.value)
    assert list(path.parent.iterdir()) == []


def test_a_limited_process_on_a_full_disk_fails_cleanly(
    limited_env: LimitedEnv, small_disk: Path
) -> None:
    pod = small_disk / "pod"
    result = run([WORKLOAD, "--kernels", "1"], limited_env('{"0": "2GiB"}', SHM_PATH=str(pod)))
    assert result.returncode == 1, result  # not -SIGBUS
    (line,) = result.stderr.splitlines()
    assert "No space left on device" in line
    assert list(pod.iterdir()) == []


# A region truncated under the daemon


def test_guarded_calls_report_a_truncated_file(base: Path) -> None:
    with make(base, "ns", "pod") as region:
        os.truncate(region.path, 0)
        library = regions._library()
        fault = regions.CONSTANTS["VGPU_REGION_FAULT"]
        view = regions.ffi.new("struct vgpu_region_device_view *")
        assert library.vgpu_region_safe_read_device(region._region, 0, view) == fault
        assert (
            library.vgpu_region_safe_store_limits(
                region._region, 0, regions.ffi.new("struct vgpu_region_limits *")
            )
            == fault
        )
        assert library.vgpu_region_safe_reclaim_process(region._region, 0, 1, 2, 3) == fault
        for action in (
            lambda: region.devices,
            lambda: region.processes,
            lambda: region.set_limits(UUIDS[0], memory_limit=GiB),
            region.reap,
            region.settle_generations,
        ):
            with pytest.raises(RegionError, match="truncated"):
                action()
        assert region.problem() == f"truncated (0 of {regions.REGION_SIZE} bytes)"


def _flap(path: Path, seconds: float) -> None:
    data = path.read_bytes()
    end = time.monotonic() + seconds
    with path.open("r+b") as stream:
        while time.monotonic() < end:
            os.ftruncate(stream.fileno(), 0)
            time.sleep(0.0002)
            os.pwrite(stream.fileno(), data, 0)
            time.sleep(0.0002)


def _read_while_flapping(path: Path, opened: Any, stop: Any, results: Any) -> None:
    """What the daemon does to a pod every pass, over and over, until told to stop."""
    counts = {"ok": 0, "error": 0}
    with regions.open_region(path) as region:
        opened.set()  # mapped while whole, as the daemon maps a pod before it is damaged
        while not stop.is_set():
            try:
                _ = region.devices, region.processes, region.problem()
                region.set_limits(UUIDS[0], compute_limit=2500)
                region.reap()
                counts["ok"] += 1
            except RegionError:
                counts["error"] += 1
    results.put(counts)


def test_the_daemon_side_survives_a_region_truncated_in_a_loop(base: Path) -> None:
    make(base, "ns", "pod").close()
    path = regions.region_path(base, "ns", "pod")
    opened, stop, results = FORK.Event(), FORK.Event(), FORK.Queue()
    reader = FORK.Process(target=_read_while_flapping, args=(path, opened, stop, results))
    reader.start()
    assert opened.wait(timeout=30)
    flapper = FORK.Process(target=_flap, args=(path, 3.0))
    flapper.start()
    flapper.join(timeout=60)
    stop.set()  # the reader ran all through the flapping
    counts = results.get(timeout=60)
    reader.join(timeout=30)
    assert reader.exitcode == 0  # no SIGBUS
    assert counts["error"] > 0 and counts["ok"] + counts["error"] > 10, counts


def test_a_tenant_truncating_its_own_region_only_hurts_itself(base: Path) -> None:
    """The file stays the same inode; once restored, the daemon reads it again."""
    with make(base, "ns", "pod") as region:
        data = region.path.read_bytes()
        os.truncate(region.path, 0)
        assert region.problem() is not None
        with region.path.open("r+b") as stream:
            os.pwrite(stream.fileno(), data, 0)
        assert region.problem() is None
        assert region.devices[0].memory_limit == 4 * GiB
