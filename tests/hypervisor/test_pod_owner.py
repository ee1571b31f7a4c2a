"""`pods create --owner`: the pod's region belongs to the user (or group) who runs its programs."""

import os
import stat

import pytest

from tests.hypervisor.conftest import Daemon


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_the_region_belongs_to_the_pods_owner(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "mine", "--mem", "0=1GiB", "--owner", "65534:65534")
    assert created.returncode == 0, created.stderr
    folder = daemon.base / "default" / "mine"
    region = (folder / "shm").stat()
    assert (region.st_uid, region.st_gid, stat.S_IMODE(region.st_mode)) == (65534, 65534, 0o660)
    # The folder is the daemon's: the tenant cannot remove or replace its region.
    info = folder.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 65534, 0o755)


def test_a_group_alone_keeps_the_daemons_user(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "shared", "--mem", "0=1GiB", "--owner", ":0")
    assert created.returncode == 0, created.stderr
    info = (daemon.base / "default" / "shared" / "shm").stat()
    assert (info.st_uid, info.st_gid) == (os.geteuid(), 0)


@pytest.mark.parametrize(
    ("value", "words"),
    [("no-such-user-here", "no user 'no-such-user-here'"), (":", "expected USER, USER:GROUP")],
)
def test_a_bad_owner_is_one_line(daemon: Daemon, value: str, words: str) -> None:
    created = daemon.cli("pods", "create", "p", "--mem", "0=1GiB", "--owner", value)
    assert created.returncode == 2
    assert words in created.stderr and created.stderr.count("\n") == 1
