"""A tenant cannot annotate its pod above what the scheduler charged or the admin set.

Tenants may patch their own pods' annotations, so annotations only lower a pod's limits: its
resources are the ceiling (a whole GPU where it asks only for `vgpu.io/gpu`), an admin's change
through the API becomes the ceiling, and a pod with annotations alone keeps the limits it
started with. End to end: the daemon following the API-server stand-in on the simulated GPU."""

from pathlib import Path
from typing import Any

from vgpu_limiter.region import open_region

from tests.hypervisor.conftest import Daemon, wait_for
from tests.kubernetes.test_pod_source import (
    COMPUTE,
    VRAM,
    _limits,
    _log,
    _memory_total,
    _refused,
    _run,
    daemon,
)
from tests.support.apiserver import ApiServer

__all__ = ["daemon"]

GiB = 1 << 30
GPU_IDS = "tensor-fusion.ai/gpu-ids"
# The test daemon counts gpu-memory in MiB (--gpu-memory-unit 1MiB).
CAPPED = {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "2048", "vgpu.io/gpu-compute": "10"}


def _refusals(api: ApiServer, pod: str) -> list[str]:
    return [
        str(e["message"])
        for e in list(api.events)
        if e["involvedObject"]["name"] == pod and e["reason"] == "LimitRaiseRefused"
    ]


def _patch(daemon: Daemon, pod: str, gpu: dict[str, Any]) -> None:
    reply = daemon.api("PATCH", f"/api/v1/pods/default/{pod}", json={"gpus": {"0": gpu}})
    assert reply.status_code == 200, reply.text


def test_a_pod_asking_only_for_a_gpu_gets_the_whole_gpu_not_no_limit(
    daemon: Daemon, api: ApiServer
) -> None:
    api.put_pod("whole", resources={"vgpu.io/gpu": "1"})
    total = _memory_total(daemon)
    assert wait_for(lambda: _limits(daemon, "whole") == (total, None), timeout=15)
    # Annotations lower it, and their removal brings the whole GPU back, not no limit.
    api.put_pod("whole", resources={"vgpu.io/gpu": "1"}, annotations={VRAM: "2Gi"})
    assert wait_for(lambda: _limits(daemon, "whole") == (2 * GiB, None), timeout=15)
    api.put_pod("whole", resources={"vgpu.io/gpu": "1"})
    assert wait_for(lambda: _limits(daemon, "whole") == (total, None), timeout=15)


def test_annotations_never_raise_what_the_resources_set(daemon: Daemon, api: ApiServer) -> None:
    # The tenant asks for 2 GiB and 10 % and annotates itself up to the whole GPU.
    api.put_pod("capped", resources=CAPPED, annotations={VRAM: "16Gi", COMPUTE: "100"})
    refused = wait_for(lambda: len(_refusals(api, "capped")) == 2 and _refusals(api, "capped"))
    assert _limits(daemon, "capped") == (2 * GiB, 10.0)
    assert sorted(line.split(":")[1].strip() for line in refused) == [
        "tensor-fusion.ai/compute-limit='100'",
        "tensor-fusion.ai/vram-limit='16Gi'",
    ]
    assert all(line in _log(daemon) for line in refused)
    assert _refused(_run(daemon, "capped", "--alloc", "2GiB"))  # 512 MiB of context + 2 GiB

    # Lower: applied. Removed: back to the resources, never to no limit.
    api.put_pod("capped", resources=CAPPED, annotations={VRAM: "1Gi", COMPUTE: "5"})
    assert wait_for(lambda: _limits(daemon, "capped") == (1 * GiB, 5.0), timeout=15)
    api.put_pod("capped", resources=CAPPED)
    assert wait_for(lambda: _limits(daemon, "capped") == (2 * GiB, 10.0), timeout=15)


def test_a_pod_with_annotations_alone_keeps_the_limits_it_started_with(
    daemon: Daemon, api: ApiServer
) -> None:
    """No scheduler charged it anything: what it started with is its ceiling, over restarts."""
    started = {VRAM: "2Gi", COMPUTE: "10", GPU_IDS: "0"}
    api.put_pod("self", annotations=started)
    assert wait_for(lambda: _limits(daemon, "self") == (2 * GiB, 10.0), timeout=15)
    api.put_pod("self", annotations={VRAM: "16Gi", COMPUTE: "100", GPU_IDS: "0"})
    (refused, _) = wait_for(lambda: len(_refusals(api, "self")) == 2 and _refusals(api, "self"))
    assert "the ceiling from the pod's first annotations (it asks for no vgpu resource)" in refused
    assert _limits(daemon, "self") == (2 * GiB, 10.0)

    daemon.stop()  # what it started with is kept by the daemon across a restart
    daemon.start()
    api.put_pod("self", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "self") == (1 * GiB, 10.0), timeout=15)
    api.put_pod("self")  # every annotation removed: the region stays, with its first limits
    assert wait_for(lambda: _limits(daemon, "self") == (2 * GiB, 10.0), timeout=15)
    assert _refused(_run(daemon, "self", "--alloc", "2GiB"))


def test_with_tenant_raise_a_pod_with_annotations_alone_may_raise_its_limits(
    tmp_path: Path, api: ApiServer
) -> None:
    """The setting off (the default) is the test above; on, the tenant's edit applies."""
    flags = (
        "--kubernetes",
        "--node-name", "node-a",
        "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
        "--tenant-raise",
    )  # fmt: skip
    daemon = Daemon(tmp_path, extra=flags)
    daemon.start()
    try:
        api.put_pod("self", annotations={VRAM: "2Gi", COMPUTE: "10", GPU_IDS: "0"})
        assert wait_for(lambda: _limits(daemon, "self") == (2 * GiB, 10.0), timeout=15)
        api.put_pod("self", annotations={VRAM: "4Gi", COMPUTE: "30", GPU_IDS: "0"})
        assert wait_for(lambda: _limits(daemon, "self") == (4 * GiB, 30.0), timeout=15)
        assert not _refusals(api, "self")
    finally:
        daemon.close()


def test_an_admins_change_is_the_ceiling_annotations_may_only_lower(
    daemon: Daemon, api: ApiServer
) -> None:
    resources = {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "4096", "vgpu.io/gpu-compute": "50"}
    api.put_pod("ruled", resources=resources, annotations={GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "ruled") == (4 * GiB, 50.0), timeout=15)

    _patch(daemon, "ruled", {"memory": 1 * GiB})  # the admin lowers it
    api.put_pod("ruled", resources=resources, annotations={GPU_IDS: "0", VRAM: "3Gi"})
    (refused,) = wait_for(lambda: _refusals(api, "ruled"), timeout=15)
    assert (
        "vram-limit='3Gi': asks more than 1 GiB, the ceiling from the limit set through the API"
        in refused
    )
    assert _limits(daemon, "ruled") == (1 * GiB, 50.0)

    # Raising is the admin's, above the resources too; the 3Gi annotation, no longer refused,
    # lowers the new ceiling at once (the change is booked as the API makes it).
    _patch(daemon, "ruled", {"memory": 8 * GiB})
    assert wait_for(lambda: _limits(daemon, "ruled") == (3 * GiB, 50.0), timeout=15)
    api.put_pod("ruled", resources=resources, annotations={GPU_IDS: "0", VRAM: "6Gi"})
    assert wait_for(lambda: _limits(daemon, "ruled") == (6 * GiB, 50.0), timeout=15)
    api.put_pod("ruled", resources=resources, annotations={GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "ruled") == (8 * GiB, 50.0), timeout=15)
    assert "GPU-5157a1e0-0000-4000-8000-000000000001 memory limit set to 8 GiB" in _log(daemon)


def test_limits_a_tenant_writes_into_its_region_raise_no_ceiling(
    daemon: Daemon, api: ApiServer
) -> None:
    """The region is the tenant's to write (its processes keep their usage there): a limit
    raised in it is not the admin's, so the pod source's next write sets the pod's back."""
    resources = {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "2048", "vgpu.io/gpu-compute": "20"}
    api.put_pod("sneaky", resources=resources, annotations={GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "sneaky") == (2 * GiB, 20.0), timeout=15)
    with open_region(daemon.base / "default" / "sneaky" / "shm") as region:
        (device,) = region.devices
        region.set_limits(device.uuid, 16 * GiB, 10000)  # what a tenant's process can write
    api.put_pod("sneaky", resources=resources, annotations={GPU_IDS: "0", VRAM: "12Gi"})
    assert wait_for(lambda: _limits(daemon, "sneaky") == (2 * GiB, 20.0), timeout=15)
    assert wait_for(lambda: "changed in its region, not through the API" in _log(daemon))
    assert wait_for(lambda: _refusals(api, "sneaky"))  # 12Gi: more than the resources' 2 GiB


def test_an_admins_change_outlives_a_daemon_restart(daemon: Daemon, api: ApiServer) -> None:
    """Booked when the API makes it, not at the pod's next event: a restart right after does
    not take it for the tenant's and set it back."""
    resources = {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "4096", "vgpu.io/gpu-compute": "50"}
    api.put_pod("ruled", resources=resources, annotations={GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "ruled") == (4 * GiB, 50.0), timeout=15)
    _patch(daemon, "ruled", {"memory": 1 * GiB})
    daemon.stop()
    daemon.start()
    api.put_pod("ruled", resources=resources, annotations={GPU_IDS: "0", VRAM: "3Gi"})
    assert wait_for(lambda: _refusals(api, "ruled"), timeout=15)  # 3Gi: above the admin's 1 GiB
    assert _limits(daemon, "ruled") == (1 * GiB, 50.0)
    assert "not through the API" not in _log(daemon)


def test_an_earlier_pods_admin_change_is_not_the_next_ones(daemon: Daemon, api: ApiServer) -> None:
    resources = {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "2048", "vgpu.io/gpu-compute": "20"}
    api.put_pod("web-0", resources=resources, annotations={GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "web-0") == (2 * GiB, 20.0), timeout=15)
    _patch(daemon, "web-0", {"memory": 16 * GiB, "compute": 100})
    api.delete_pod("web-0")
    assert wait_for(lambda: daemon.api("GET", "/api/v1/pods/default/web-0").status_code == 404)
    api.put_pod("web-0", resources=resources, annotations={GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "web-0") == (2 * GiB, 20.0), timeout=15)
    with open_region(daemon.base / "default" / "web-0" / "shm") as region:
        (device,) = region.devices
        region.set_limits(device.uuid, 16 * GiB, 0)  # the earlier pod's admin values
    api.put_pod("web-0", resources=resources, annotations={GPU_IDS: "0", VRAM: "12Gi"})
    assert wait_for(lambda: _limits(daemon, "web-0") == (2 * GiB, 20.0), timeout=15)
