"""Scheduling through the daemon (issue 13): burst limits, freeze and resume by API and CLI, the
freeze the daemon renews, and the per-pod scheduler series in /metrics and the influx file."""

import json
import os
import time
from pathlib import Path

from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_limiter import region as regions
from vgpu_limiter.region import FLAG_FROZEN, Region, ffi, open_region

from tests.hypervisor.conftest import Daemon, wait_for
from tests.hypervisor.test_boost import SIM_GPU0


def test_burst_limits_by_api_and_cli(daemon: Daemon) -> None:
    body = {"name": "b", "gpus": {"0": {"compute": 30, "burst": 100}}}
    created = daemon.api("POST", "/api/v1/pods", json=body)
    assert created.status_code == 201, created.text
    (gpu,) = created.json()["gpus"]
    assert (gpu["compute_limit"], gpu["compute_burst"]) == (30.0, 100.0)
    with open_region(daemon.base / "default" / "b" / "shm") as region:
        assert region.devices[0].compute_soft_limit == 10000
    changed = daemon.cli("pods", "update", "b", "--burst", "0=60", "--json")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["gpus"][0]["compute_burst"] == 60.0
    # A burst below the hard limit, or without one, is refused with one line naming it.
    below = daemon.api("PATCH", "/api/v1/pods/default/b", json={"gpus": {"0": {"burst": 20}}})
    assert below.status_code == 422 and "burst 20 % is below the compute limit 30 %" in below.text
    none = daemon.api("POST", "/api/v1/pods", json={"name": "n", "gpus": {"0": {"burst": 50}}})
    assert none.status_code == 422 and "needs a compute limit" in none.text
    bad = daemon.cli("pods", "update", "b", "--burst", "0")
    assert bad.returncode == 2 and "--burst '0': expected GPU=VALUE" in bad.stderr
    cleared = daemon.cli("pods", "update", "b", "--burst", "0=none", "--json")
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout)["gpus"][0]["compute_burst"] is None


def test_freeze_and_resume(daemon: Daemon) -> None:
    assert daemon.cli("pods", "create", "f", "--compute", "0=50").returncode == 0
    frozen = daemon.cli("pods", "freeze", "f", "--json")
    assert frozen.returncode == 0, frozen.stderr
    assert json.loads(frozen.stdout)["frozen"] is True
    path = daemon.base / "default" / "f" / "shm"
    with open_region(path) as region:
        assert region.frozen
        first = region.freeze_until_ns
        # The daemon renews the freeze at every pass, so it never runs out while it lives.
        wait_for(lambda: region.freeze_until_ns > first, timeout=5)
    # The influx file notes a change it saw between two of its writes: let it see the freeze.
    wait_for(
        lambda: daemon.metrics_file.exists() and "event=freeze" in daemon.metrics_file.read_text(),
        timeout=30,
    )
    reply = daemon.http.get("/metrics").text.splitlines()
    assert any(line.startswith("tf_pod_frozen{") and line.endswith(" 1.0") for line in reply)
    for name in ("gpu", "throttled", "burst"):
        assert any(line.startswith(f"tf_pod_{name}_seconds_total{{") for line in reply), name
    resumed = daemon.api("POST", "/api/v1/pods/default/f/resume")
    assert resumed.status_code == 200 and resumed.json()["frozen"] is False
    with open_region(path) as region:
        assert not region.frozen and region.freeze_until_ns == 0
    missing = daemon.api("POST", "/api/v1/pods/default/nope/freeze")
    assert missing.status_code == 404
    assert daemon.api("POST", "/api/v1/pods/default/f/freeze", auth=False).status_code == 401

    def events() -> list[str] | None:
        if not daemon.metrics_file.exists():
            return None
        lines = daemon.metrics_file.read_text().splitlines()
        found = [line for line in lines if line.startswith("tf_scheduler_event,")]
        return found if any("event=resume" in line for line in found) else None

    lines = wait_for(events, timeout=30)
    assert any("event=freeze" in line and "worker=f" in line for line in lines)


def test_freezing_one_gpu(daemon: Daemon) -> None:
    body = {"name": "two", "gpus": {"0": {"compute": 50}, "1": {"compute": 50}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    uuid1 = daemon.http.get("/api/v1/gpus").json()[1]["uuid"]
    frozen = daemon.cli("pods", "freeze", "two", "--gpu", "1", "--json")
    assert frozen.returncode == 0, frozen.stderr
    with open_region(daemon.base / "default" / "two" / "shm") as region:
        assert region.frozen and [g.lower() for g in region.frozen_gpus()] == [uuid1.lower()]
    unknown = daemon.api("POST", "/api/v1/pods/default/two/freeze", params={"gpu": "7"})
    assert unknown.status_code == 422
    assert "gpu 7: pod default/two has no limits on it" in unknown.text
    shown = json.loads(daemon.cli("pods", "get", "two", "--json").stdout)
    assert [gpu["frozen"] for gpu in shown["gpus"]] == [False, True]
    # The daemon's renewals keep the freeze on GPU 1 only.
    with open_region(daemon.base / "default" / "two" / "shm") as region:
        first = region.freeze_until_ns
        wait_for(lambda: region.freeze_until_ns > first, timeout=5)
        assert len(region.frozen_gpus()) == 1
    assert daemon.cli("pods", "resume", "two").returncode == 0


def test_a_whole_pod_freeze_and_one_gpus_hold_every_gpu_in_either_order(daemon: Daemon) -> None:
    """A whole-pod freeze after one GPU's held that GPU alone while the pod read as frozen;
    one GPU's after a whole-pod freeze thawed the others."""
    body = {"name": "two", "gpus": {"0": {"compute": 50}, "1": {"compute": 50}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    orders: list[tuple[list[str], list[str]]] = [(["--gpu", "1"], []), ([], ["--gpu", "1"])]
    for order in orders:
        for flags in order:
            frozen = daemon.cli("pods", "freeze", "two", *flags)
            assert frozen.returncode == 0, frozen.stderr
        with open_region(daemon.base / "default" / "two" / "shm") as region:
            assert region.frozen and region.frozen_gpus() == []  # all of them
        shown = json.loads(daemon.cli("pods", "get", "two", "--json").stdout)
        assert [gpu["frozen"] for gpu in shown["gpus"]] == [True, True], order
        one = daemon.api("POST", "/api/v1/pods/default/two/resume", params={"gpu": "1"})
        assert one.status_code == 422 and "resumes every GPU" in one.text  # it resumed all
        assert daemon.cli("pods", "resume", "two").returncode == 0
        shown = json.loads(daemon.cli("pods", "get", "two", "--json").stdout)
        assert [gpu["frozen"] for gpu in shown["gpus"]] == [False, False]


def test_a_freeze_ends_when_the_daemon_is_gone(daemon: Daemon) -> None:
    assert daemon.cli("pods", "create", "g", "--compute", "0=50").returncode == 0
    assert daemon.cli("pods", "freeze", "g").returncode == 0
    daemon.stop()
    with open_region(daemon.base / "default" / "g" / "shm") as region:
        left = (region.freeze_until_ns - time.monotonic_ns()) / 1e9
    # Nobody renews it now: it holds for at most the daemon's hold (10 s).
    assert 0 < left <= 10.5


def clear_freeze_until_seen(daemon: Daemon, region: Region) -> None:
    """Clear the pod's frozen flag as a process of the pod can, until the daemon has made the
    freeze again and said so. A clear that lands between a pass's look at the flag and its
    renewal of the freeze is undone by the renewal, unsaid: it is cleared again."""
    for _ in range(5):
        region.change_flags(clear=FLAG_FROZEN)
        wait_for(lambda: region.flags & FLAG_FROZEN, timeout=10)
        if "frozen again" in daemon.log_file.read_text():
            return


def test_a_freeze_cleared_in_the_region_is_made_again(daemon: Daemon) -> None:
    """A process of the pod can write its region: before, one that cleared the frozen flag ran
    on, and the pod read as not frozen. The daemon holds the freezes it made."""
    assert daemon.cli("pods", "create", "cold", "--compute", "0=30").returncode == 0
    assert daemon.cli("pods", "freeze", "cold").returncode == 0
    with open_region(daemon.base / "default" / "cold" / "shm") as region:
        clear_freeze_until_seen(daemon, region)
    wait_for(lambda: daemon.api("GET", "/api/v1/pods/default/cold").json()["frozen"], timeout=5)
    assert daemon.log_file.read_text().count("frozen again") == 1  # logged once, however often
    assert daemon.cli("pods", "resume", "cold").returncode == 0
    with open_region(daemon.base / "default" / "cold" / "shm") as region:
        time.sleep(1.5)  # passes: a resumed pod stays resumed
        assert not region.flags & FLAG_FROZEN


def test_a_freeze_a_tenant_narrows_to_fewer_gpus_is_made_again(tmp_path: Path) -> None:
    """A process of the pod can write the marks of the GPUs a freeze holds: before, a whole-pod
    freeze it made hold GPU 1 only, or a freeze of GPUs 0 and 1 it made hold GPU 1 only, let
    its launches on GPU 0 go on while the pod read as frozen, and the daemon renewed it so."""
    gpus = [SIM_GPU0, SIM_GPU0[:-1] + "2"]
    store = PodStore(tmp_path / "base")
    try:
        store.create("default", "cold", dict.fromkeys(gpus, GpuLimits(compute=3000)))
        with open_region(regions.region_path(store.base, "default", "cold")) as region:
            for admin in ([None], gpus):
                for gpu in admin:
                    store.freeze("default", "cold", gpu)
                region.resume()  # the tenant, which may write its region
                region.freeze(60, gpus[1])
                store.renew_freezes(store.scan())  # a pass
                assert region.frozen
                held = {gpu.lower() for gpu in region.frozen_gpus()}
                assert held == (set() if admin == [None] else {gpu.lower() for gpu in gpus})
                store.resume("default", "cold")
                assert not region.frozen
    finally:
        store.close()


def test_a_freeze_whose_deadline_is_written_past_is_made_again(daemon: Daemon) -> None:
    """A process of the pod can write its freeze's deadline too: before, one written in the
    past let its launches go on at once, and the daemon's next pass took the freeze for one
    that ran out and resumed the pod (it read as not frozen, and stayed so)."""
    assert daemon.cli("pods", "create", "cold", "--compute", "0=30").returncode == 0
    assert daemon.cli("pods", "freeze", "cold").returncode == 0
    path = daemon.base / "default" / "cold" / "shm"
    offset = ffi.offsetof("struct vgpu_region", "freeze_until_ns")
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, (1).to_bytes(8, "little"), offset)
    finally:
        os.close(fd)
    with open_region(path) as region:
        time.sleep(1.5)  # passes
        assert region.frozen
    wait_for(lambda: daemon.api("GET", "/api/v1/pods/default/cold").json()["frozen"], timeout=5)
    assert "frozen again" in daemon.log_file.read_text()
