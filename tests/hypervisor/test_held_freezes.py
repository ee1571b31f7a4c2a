"""The freezes the daemon holds outlive it: a process of a frozen pod that clears its freeze
while no daemon runs is frozen again by the next daemon. Before, the freezes were held in
memory alone, and the pod ran on, read as not frozen, after the restart. Each store below is
one daemon's (a restart is a new store on the same base path)."""

import json
import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.held_freezes import FREEZES_FILE, HeldFreezes
from vgpu_hypervisor.daemon.pods import POLICY_FOLDER, PodStore
from vgpu_limiter import region as regions
from vgpu_limiter.region import Region, open_region

from tests.hypervisor.conftest import Daemon, Said, wait_for
from tests.hypervisor.test_boost import SIM_GPU0

GPUS = [SIM_GPU0, SIM_GPU0[:-1] + "2"]


@contextmanager
def daemon_store(base: Path) -> Iterator[PodStore]:
    store = PodStore(base)
    try:
        yield store
    finally:
        store.close()


def a_pass(store: PodStore) -> None:
    store.renew_freezes(store.scan())


def region_of(base: Path, name: str) -> Region:
    return open_region(regions.region_path(base, "default", name))


@pytest.mark.parametrize("frozen", [[None], GPUS])
def test_a_freeze_cleared_while_no_daemon_runs_is_made_again_by_the_next(
    tmp_path: Path, frozen: list[str | None]
) -> None:
    base = tmp_path / "base"
    with daemon_store(base) as store:
        store.create("default", "cold", dict.fromkeys(GPUS, GpuLimits(compute=3000)))
        for gpu in frozen:
            store.freeze("default", "cold", gpu)
    with region_of(base, "cold") as region:
        region.resume()  # the tenant, which may write its region, while no daemon runs
        assert not region.frozen
        with daemon_store(base) as store:
            a_pass(store)
            assert region.frozen
            held = {gpu.lower() for gpu in region.frozen_gpus()}
            assert held == {gpu.lower() for gpu in frozen if gpu}  # the same GPUs
            assert store.get("default", "cold").frozen


def test_a_freeze_that_ran_out_while_no_daemon_ran_is_made_again(tmp_path: Path) -> None:
    """A freeze no daemon renews ends within its hold (the pod is not left waiting on a dead
    daemon); the admin's freeze holds again once a daemon runs."""
    base = tmp_path / "base"
    with daemon_store(base) as store:
        store.create("default", "cold", {SIM_GPU0: GpuLimits(compute=3000)})
        store.freeze("default", "cold")
    with region_of(base, "cold") as region:
        region.renew_freeze(0.001)  # as if the hold had run out
        time.sleep(0.01)
        assert not region.frozen
        with daemon_store(base) as store:
            a_pass(store)
            assert region.frozen


def test_a_pod_resumed_before_a_restart_stays_resumed(tmp_path: Path) -> None:
    base = tmp_path / "base"
    with daemon_store(base) as store:
        store.create("default", "warm", {SIM_GPU0: GpuLimits(compute=3000)})
        store.freeze("default", "warm")
        store.resume("default", "warm")
    with daemon_store(base) as store, region_of(base, "warm") as region:
        a_pass(store)
        assert not region.frozen and not store.get("default", "warm").frozen


def test_a_pod_made_again_under_a_frozen_ones_name_is_not_frozen(tmp_path: Path) -> None:
    """A new pod of the name is another pod, though its region file may take the deleted
    one's inode, the identity a freeze is held with (here it does, with the daemon's file
    written between): the freeze is forgotten at the delete."""
    base = tmp_path / "base"
    with daemon_store(base) as store:
        store.create("default", "cold", {SIM_GPU0: GpuLimits(compute=3000)})
        store.freeze("default", "cold")
        store.delete("default", "cold")
        store.create("default", "cold", {SIM_GPU0: GpuLimits(compute=3000)})
        with region_of(base, "cold") as region:
            a_pass(store)
            assert not region.frozen
    with daemon_store(base) as store, region_of(base, "cold") as region:
        a_pass(store)
        assert not region.frozen


def test_a_restarted_daemon_holds_the_freeze_a_tenant_cleared_while_it_was_down(
    daemon: Daemon,
) -> None:
    assert daemon.cli("pods", "create", "cold", "--compute", "0=30").returncode == 0
    assert daemon.cli("pods", "freeze", "cold").returncode == 0
    daemon.stop(signal.SIGKILL)
    with open_region(daemon.base / "default" / "cold" / "shm") as region:
        region.resume()
        daemon.start()
        wait_for(lambda: region.frozen, timeout=10)
    assert daemon.api("GET", "/api/v1/pods/default/cold").json()["frozen"]
    assert "frozen again" in daemon.log_file.read_text()


@pytest.mark.parametrize(
    "document",
    [
        {"namespace": "default"},
        [{"namespace": "default", "name": "cold", "region": [1, 2]}],
        [{"namespace": "default", "name": "cold", "region": [1, 2], "gpus": []}],
        [{"namespace": "default", "name": "cold", "region": [1, True], "gpus": [None]}],
        [{"namespace": "default", "name": "cold", "region": [1, 2], "gpus": [3]}],
        [{"namespace": 1, "name": "cold", "region": [1, 2], "gpus": [None]}],
    ],
)
def test_a_damaged_freezes_file_is_said_and_holds_none(tmp_path: Path, document: object) -> None:
    folder = tmp_path / POLICY_FOLDER
    folder.mkdir(mode=0o700)
    (folder / FREEZES_FILE).write_text(json.dumps(document))
    said = Said()
    logging.getLogger("vgpu_hypervisor").addHandler(said)
    try:
        held = HeldFreezes(folder)
    finally:
        logging.getLogger("vgpu_hypervisor").removeHandler(said)
    assert held.gpus(("default", "cold"), (1, 2)) is None
    assert any(f"{FREEZES_FILE}: cannot read" in line for line in said.lines)


def test_the_held_freezes_read_back_as_written(tmp_path: Path) -> None:
    folder = tmp_path / POLICY_FOLDER
    written = HeldFreezes(folder)
    written.hold(("default", "cold"), (1, 2), [None])
    written.hold(("team", "hot"), (3, 4), [GPUS[1], GPUS[0]])
    read = HeldFreezes(folder)
    assert read.gpus(("default", "cold"), (1, 2)) == frozenset([None])
    assert read.gpus(("team", "hot"), (3, 4)) == frozenset(GPUS)
    assert read.gpus(("team", "hot"), (3, 5)) is None  # another file of the name
    read.keep_only([("team", "hot")])
    assert HeldFreezes(folder).gpus(("default", "cold"), (1, 2)) is None
