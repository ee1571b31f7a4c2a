"""A daemon killed and started again, a second one on its base path, and its own files on a
full disk: what the pods hold stays as it was."""

import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon.private_file import PrivateFile
from vgpu_limiter.region import open_region

from tests.hypervisor.conftest import Daemon, Said, wait_for
from tests.hypervisor.test_scheduling_api import clear_freeze_until_seen

GiB = 1 << 30


def test_a_second_daemon_on_the_same_base_is_refused_and_the_first_ones_changes_stand(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Before, it started and ran its passes over the same regions with limits held apart from
    the first one's: a raise answered 200 by the first (2 → 6 GiB, 30 → 60 %) was set back by
    the second within a second, and both daemons then showed the old limits."""
    body = {"name": "x", "gpus": {"0": {"memory": "2GiB", "compute": 30}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    second = Daemon(tmp_path / "second")
    second.root.mkdir()
    second.base = daemon.base
    try:
        with pytest.raises(AssertionError, match="daemon exited 1") as refused:
            second.start()
    finally:
        second.close()
    stderr = str(refused.value).split(": ", 1)[1]
    pid = daemon.process.pid if daemon.process is not None else None
    assert stderr.strip().count("\n") == 0, stderr
    assert f"error: another daemon (pid {pid}) serves the base path {daemon.base}" in stderr
    raise_ = {"gpus": {"0": {"memory": "6GiB", "compute": 60}}}
    assert daemon.api("PATCH", "/api/v1/pods/default/x", json=raise_).status_code == 200
    time.sleep(3)  # passes (one a second): the second daemon set it back within one
    with open_region(daemon.base / "default" / "x" / "shm") as region:
        limits = region.devices[0].limits
    assert (limits.memory_limit, limits.compute_limit) == (6 * GiB, 6000)


def test_a_daemon_killed_frees_its_base_for_the_next(daemon: Daemon) -> None:
    """The lock goes with the process, however it ends: no stale lock to remove by hand."""
    daemon.stop(signal.SIGKILL)
    daemon.start()
    assert daemon.http.get("/healthz").status_code == 200


def test_a_freeze_made_before_a_restart_is_held_after_it(daemon: Daemon) -> None:
    """A daemon that starts renews the freezes it finds; before, it did not hold them: a
    process of the pod cleared the flag after the restart and the pod ran on, read as not
    frozen (the daemon's own freezes were made again)."""
    assert daemon.cli("pods", "create", "cold", "--compute", "0=30").returncode == 0
    assert daemon.cli("pods", "freeze", "cold").returncode == 0
    daemon.stop(signal.SIGKILL)
    daemon.start()
    path = daemon.base / "default" / "cold" / "shm"
    assert daemon.api("GET", "/api/v1/pods/default/cold").json()["frozen"]
    # A pass of the new daemon has renewed (and so held) it: its deadline moved.
    with open_region(path) as region:
        deadline = region.freeze_until_ns
        wait_for(lambda: region.freeze_until_ns != deadline, timeout=10)
        clear_freeze_until_seen(daemon, region)
    wait_for(lambda: daemon.api("GET", "/api/v1/pods/default/cold").json()["frozen"], timeout=5)
    assert "frozen again" in daemon.log_file.read_text()


def test_a_full_disk_leaves_the_daemons_file_as_it_was(small_disk: Path) -> None:
    """Before, one write(2) wrote what fitted and the cut file was renamed over the good one:
    the next daemon found it unreadable and started afresh, the limits it held gone."""
    book = PrivateFile(small_disk / ".daemon", "limits.json")
    kept = [{"name": "a"}]
    book.save(kept)
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    os.truncate(filler, filler.stat().st_size - 8192)  # two pages left: less than the file
    said = Said()
    logging.getLogger("vgpu_hypervisor").addHandler(said)
    try:
        book.save([{"name": "a" * 40000}])
    finally:
        logging.getLogger("vgpu_hypervisor").removeHandler(said)
    assert json.loads(book.path.read_bytes()) == kept
    assert sorted(p.name for p in book.folder.iterdir()) == ["limits.json"]
    assert any("cannot write: No space left on device" in line for line in said.lines)


@pytest.mark.parametrize("content", ["null", "{"])
def test_a_damaged_file_of_the_daemons_is_said_and_read_as_none(
    tmp_path: Path, content: str
) -> None:
    """Before, a file holding ``null`` was taken for no file at all, and nothing was said."""
    folder = tmp_path / ".daemon"
    folder.mkdir(mode=0o700)
    (folder / "limits.json").write_text(content)
    said = Said()
    logging.getLogger("vgpu_hypervisor").addHandler(said)
    try:
        assert PrivateFile(folder, "limits.json").load() is None
    finally:
        logging.getLogger("vgpu_hypervisor").removeHandler(said)
    assert any("limits.json: cannot read" in line for line in said.lines)
