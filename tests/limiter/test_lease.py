"""The device lease file from Python: the daemon's boost, as the limiter reads it."""

import os
import stat
import time
from pathlib import Path

import pytest
from vgpu_limiter.lease import BOOST_MAX, BOOST_ONE, DeviceLease, lease_path
from vgpu_limiter.region import CONSTANTS, RegionError

UUID = "GPU-5157A1E0-0000-4000-8000-000000000001"


def test_a_new_lease_is_made_as_the_limiter_makes_it(tmp_path: Path) -> None:
    with DeviceLease.open(tmp_path, UUID) as lease:
        assert lease.path == tmp_path / ".devices" / ("GPU-" + UUID[4:].lower())
        assert lease.boost() is None
    assert stat.S_IMODE(lease.path.stat().st_mode) == 0o666
    assert stat.S_IMODE(lease.path.parent.stat().st_mode) == 0o1777
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
    foreign = lease_path(tmp_path, UUID)
    foreign.write_bytes(b"not a lease".ljust(128, b"\0"))
    with pytest.raises(RegionError, match=r"not a device lease of version 1$"):
        DeviceLease.open(tmp_path, UUID)
    with pytest.raises(ValueError, match="bad GPU UUID"):
        DeviceLease.open(tmp_path, "GPU-1")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_base_is_a_region_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(RegionError, match="cannot open the device lease"):
            DeviceLease.open(tmp_path / "base", UUID)
    finally:
        tmp_path.chmod(0o700)
