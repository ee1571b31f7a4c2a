"""The device lease file from Python: the daemon's boost, as the limiter reads it."""

import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest
from vgpu_limiter.lease import BOOST_MAX, BOOST_ONE, DeviceLease, lease_path, node_path
from vgpu_limiter.region import CONSTANTS, RegionError, ffi

UUID = "GPU-5157A1E0-0000-4000-8000-000000000001"


def test_a_new_lease_is_made_as_the_limiter_makes_it(tmp_path: Path) -> None:
    with DeviceLease.open(tmp_path, UUID) as lease:
        assert lease.path == tmp_path / ".devices" / ("GPU-" + UUID[4:].lower())
        assert lease.boost() is None
    assert stat.S_IMODE(lease.path.stat().st_mode) == 0o660
    assert stat.S_IMODE(lease.path.parent.stat().st_mode) == 0o3770
    assert lease.path.stat().st_size == 128


@pytest.mark.parametrize(("given", "stored"), [(1.107, 11070), (0.8, BOOST_ONE), (9.0, BOOST_MAX)])
def test_boost_is_published_in_the_limiters_range(
    tmp_path: Path, given: float, stored: int
) -> None:
    with DeviceLease.open(tmp_path, UUID) as lease:
        assert lease.publish_boost(given) == stored
        assert lease.boost() == stored / BOOST_ONE
        with DeviceLease.open(tmp_path, UUID) as other:  # what another process maps
            assert other.boost() == stored / BOOST_ONE
        lease.withdraw_boost()
        assert lease.boost() is None


def test_a_boost_not_refreshed_goes_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with DeviceLease.open(tmp_path, UUID) as lease:
        lease.publish_boost(1.2)
        later = time.monotonic_ns() + CONSTANTS["VGPU_BOOST_STALE_NS"] + 1
        monkeypatch.setattr(time, "monotonic_ns", lambda: later)
        assert lease.boost() is None


def test_bad_input_is_refused_with_one_line(tmp_path: Path) -> None:
    with DeviceLease.open(tmp_path, UUID) as lease, pytest.raises(ValueError, match="finite"):
        lease.publish_boost(float("nan"))
    with pytest.raises(ValueError, match="bad GPU UUID"):
        DeviceLease.open(tmp_path, "GPU-1")


def test_a_scribbled_header_is_stamped_again(tmp_path: Path) -> None:
    """Refusing it would send every pod of the GPU to a lease of its own for good."""
    scribbled = lease_path(tmp_path, UUID)
    DeviceLease.open(tmp_path, UUID).close()
    scribbled.write_bytes(b"not a lease".ljust(128, b"\0"))
    DeviceLease.open(tmp_path, UUID).close()
    header = scribbled.read_bytes()[:12]
    assert int.from_bytes(header[:8], sys.byteorder) == CONSTANTS["VGPU_LEASE_MAGIC"]
    assert int.from_bytes(header[8:], sys.byteorder) == CONSTANTS["VGPU_LEASE_VERSION"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_base_is_a_region_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(RegionError, match="cannot open the device lease"):
            DeviceLease.open(tmp_path / "base", UUID)
    finally:
        tmp_path.chmod(0o700)


def test_the_node_file_is_the_daemons_and_beside_the_lease(tmp_path: Path) -> None:
    with DeviceLease.open(tmp_path, UUID) as lease:
        lease.publish_boost(1.5)
    node = node_path(tmp_path, UUID)
    assert stat.S_IMODE(node.stat().st_mode) == 0o644
    assert stat.S_IMODE(node.parent.stat().st_mode) == 0o755
    assert node.stat().st_size == 64


def test_the_daemon_reads_the_lease_without_mapping_it(tmp_path: Path) -> None:
    """Activity in the future is no activity, and a lease truncated by one of its writers is
    read as idle: no SIGBUS."""
    path = lease_path(tmp_path, UUID)
    offset = ffi.offsetof("struct vgpu_device_lease", "activity_ns")
    with DeviceLease.open(tmp_path, UUID) as lease:
        for activity, active in [
            (time.monotonic_ns(), True),
            (time.monotonic_ns() + 10**12, False),
        ]:
            with path.open("r+b") as file:
                file.seek(offset)
                file.write(activity.to_bytes(8, sys.byteorder))
            assert lease.active_within(5.0) is active
            assert lease.last_active() == (activity / 1e9 if active else None)
        os.truncate(path, 0)
        assert lease.active_within(5.0) is False and lease.last_active() is None


def _as_nobody(base: Path) -> str:
    """DeviceLease.open and publish_boost in a child that runs as uid and gid 65534."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        said = "opened"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            with DeviceLease.open(base, UUID) as lease:
                said = f"boost {lease.boost()}"
                lease.publish_boost(1.9)
        except (RegionError, OSError) as error:
            said += f"; {error}"
        os.write(writer, said.encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        said = pipe.read()
    os.waitpid(child, 0)
    return said


@pytest.mark.skipif(os.geteuid() != 0, reason="a second user needs root")
def test_another_user_shares_leases_only_through_the_group_and_never_writes_the_node() -> None:
    base = Path(tempfile.mkdtemp(prefix="vgpu-lease-"))
    try:
        base.chmod(0o755)
        with DeviceLease.open(base, UUID) as daemon:
            daemon.publish_boost(1.25)
            assert "Permission denied" in _as_nobody(base)  # not in the root group of .devices
            os.chown(base / ".devices", -1, 65534)
            os.chown(lease_path(base, UUID), -1, 65534)
            said = _as_nobody(base)
            expected = f"{lease_path(base, UUID)}: only the node daemon (root) publishes"
            assert said == f"boost 1.25; {expected} the boost", said
            assert daemon.boost() == 1.25
    finally:
        shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's check as root")
def test_root_refuses_a_node_folder_another_user_made(tmp_path: Path) -> None:
    (tmp_path / ".node").mkdir(mode=0o755)
    os.chown(tmp_path / ".node", 65534, 65534)
    with pytest.raises(RegionError, match=r"\.node: owned by uid 65534, not root: remove it$"):
        DeviceLease.open(tmp_path, UUID)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another group needs root")
def test_leases_follow_their_folder_to_a_new_group(tmp_path: Path) -> None:
    """`chgrp gpu-users .devices` after the daemon made its leases: they follow at its next
    start, or the group's users could not open them."""
    DeviceLease.open(tmp_path, UUID).close()
    path = lease_path(tmp_path, UUID)
    os.chown(path.parent, -1, 65534)
    assert path.stat().st_gid == 0
    DeviceLease.open(tmp_path, UUID).close()
    assert path.stat().st_gid == 65534
