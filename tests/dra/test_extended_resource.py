"""Pods asking for the extended resource ``vgpu.io/gpu`` on a DRA node (KEP-5004): the
DeviceClass with the extended-resource component of deploy/kubernetes/dra, the stand-in for
the scheduler making the pod's claim as kube-scheduler does, the stand-in kubelet preparing that
claim (named in the pod's status) over real gRPC, on the simulated GPU."""

from typing import Any

import pytest
import yaml
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.dra.inventory import NodeFacts

from tests.dra.allocator import EXTENDED_CLAIM, NODES, Unschedulable
from tests.dra.conftest import CLAIMS, DEVICE_CLASSES, NAMESPACE, NODE, GiB
from tests.dra.kubelet import Plugin
from tests.dra.test_driver import region_limits
from tests.dra.test_scenarios import DRA, Cluster, cluster, gpu_request, placed, prepare_pod
from tests.support.apiserver.kinds import POD

__all__ = ["cluster"]  # the fixture, shared with the scenarios
MiB = 1 << 20


@pytest.fixture
def mapped(cluster: Cluster) -> Cluster:
    """The cluster with the component's patch of the DeviceClass applied."""
    patch = yaml.safe_load((DRA / "extended-resource" / "deviceclass.yaml").read_text())

    def change(current: dict[str, Any]) -> dict[str, Any]:
        current["spec"].update(patch["spec"])
        return current

    cluster.api.store.update(DEVICE_CLASSES, None, patch["metadata"]["name"], change,
                             subresource=None, strict=True, dry_run=False)  # fmt: skip
    return cluster


def asking(cluster: Cluster, name: str, gpus: int, resource: str = "vgpu.io/gpu") -> None:
    """A pending pod whose second container asks for ``gpus`` of ``resource``."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [
            {"name": "side", "image": "busybox"},
            {"name": "main", "image": "cuda", "resources": {
                "limits": {resource: str(gpus), "memory": "1Gi"},
                "requests": {resource: str(gpus), "memory": "1Gi"}}},
        ]},
    }  # fmt: skip
    cluster.api.store.create(POD, NAMESPACE, body, strict=True, dry_run=False)


def extended_claim(cluster: Cluster, pod: str) -> dict[str, Any]:
    """The claim the kubelet prepares for the pod: the one its status names."""
    status = cluster.api.store.get(POD, NAMESPACE, pod)["status"]["extendedResourceClaimStatus"]
    return cluster.api.store.get(CLAIMS, NAMESPACE, status["resourceClaimName"])


def prepare(plugin: Plugin, claim: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    answer = plugin.prepare((NAMESPACE, meta["name"], meta["uid"])).claims[meta["uid"]]
    assert answer.error == "", answer.error
    return answer


def whole(facts: NodeFacts, index: int) -> dict[str, str]:
    """What one unit of ``vgpu.io/gpu`` consumes of a GPU: its request policy's defaults."""
    return {"memory": str(facts.gpus[index].memory // MiB * MiB), "compute": "100"}


def test_a_pod_asking_vgpu_io_gpu_gets_a_whole_gpu_through_the_driver(
    mapped: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    asking(mapped, "classic", 1)
    assert mapped.scheduler.schedule_pending() == {"classic": NODE}
    pod = mapped.api.store.get(POD, NAMESPACE, "classic")
    status = pod["status"]["extendedResourceClaimStatus"]
    assert status["requestMappings"] == [
        {
            "containerName": "main",
            "resourceName": "vgpu.io/gpu",
            "requestName": "container-1-request-1",
        }
    ]  # the second container; its second resource in name order (memory, vgpu.io/gpu)
    claim = extended_claim(mapped, "classic")
    meta = claim["metadata"]
    assert meta["name"].startswith("classic-extended-resources-")
    assert meta["annotations"] == {EXTENDED_CLAIM: "true"}
    assert [o["uid"] for o in meta["ownerReferences"]] == [pod["metadata"]["uid"]]
    assert claim["spec"]["devices"]["requests"] == [{"name": "container-1-request-1", "exactly": {
        "deviceClassName": "gpu.vgpu.io", "allocationMode": "ExactCount", "count": 1}}]  # fmt: skip
    assert placed(claim) == [("gpu-0", whole(facts, 0))]
    consumer = {"resource": "pods", "name": "classic", "uid": pod["metadata"]["uid"]}
    assert claim["status"]["reservedFor"] == [consumer]

    answer = prepare(plugin, claim)
    assert [d.device_name for d in answer.devices] == ["gpu-0"]
    assert [d.request_names for d in answer.devices] == [["container-1-request-1"]]
    gpu = facts.gpus[0]
    assert region_limits(mapped.dra, "classic") == {
        gpu.uuid: GpuLimits(memory=gpu.memory // MiB * MiB, compute=None)
    }
    assert plugin.unprepare((NAMESPACE, meta["name"], meta["uid"])).claims[meta["uid"]].error == ""
    assert mapped.dra.node.store.scan() == []


def test_whole_gpus_fill_the_node_and_leave_no_room_for_a_share(
    mapped: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    asking(mapped, "pair", 2)
    assert mapped.scheduler.schedule(NAMESPACE, "pair") == NODE
    claim = extended_claim(mapped, "pair")
    assert placed(claim) == [("gpu-0", whole(facts, 0)), ("gpu-1", whole(facts, 1))]
    prepare(plugin, claim)
    assert region_limits(mapped.dra, "pair") == {
        gpu.uuid: GpuLimits(memory=gpu.memory // MiB * MiB, compute=None) for gpu in facts.gpus
    }
    asking(mapped, "one-more", 1)
    mapped.template("small", [gpu_request(memory="1Gi", compute="10")])
    mapped.pod("share", "small")
    assert mapped.scheduler.schedule_pending() == {"one-more": None, "share": None}


def test_a_share_first_and_a_whole_gpu_takes_the_other(
    mapped: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    mapped.pod("share", "gpu-4gi-30")
    assert mapped.scheduler.schedule(NAMESPACE, "share") == NODE
    asking(mapped, "classic", 1)
    assert mapped.scheduler.schedule(NAMESPACE, "classic") == NODE
    assert placed(extended_claim(mapped, "classic")) == [("gpu-1", whole(facts, 1))]
    prepare_pod(plugin, mapped, "share")
    prepare(plugin, extended_claim(mapped, "classic"))
    assert region_limits(mapped.dra, "share") == {
        facts.gpus[0].uuid: GpuLimits(memory=4 * GiB, compute=3000, burst=6000)
    }
    gpu = facts.gpus[1]
    assert region_limits(mapped.dra, "classic") == {
        gpu.uuid: GpuLimits(memory=gpu.memory // MiB * MiB, compute=None)
    }


def test_without_the_component_only_the_implicit_name_maps(
    cluster: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    asking(cluster, "classic", 1)
    assert cluster.scheduler.schedule_pending() == {}  # vgpu.io/gpu is nobody's: not DRA's
    asking(cluster, "implicit", 1, "deviceclass.resource.kubernetes.io/gpu.vgpu.io")
    assert cluster.scheduler.schedule(NAMESPACE, "implicit") == NODE
    claim = extended_claim(cluster, "implicit")
    assert placed(claim) == [("gpu-0", whole(facts, 0))]
    prepare(plugin, claim)


def test_a_node_whose_device_plugin_advertises_vgpu_io_gpu_is_not_given_the_claim(
    mapped: Cluster,
) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "status": {"allocatable": {"vgpu.io/gpu": "20"}}}  # fmt: skip
    mapped.api.store.put(NODES, None, node)
    asking(mapped, "classic", 1)
    with pytest.raises(Unschedulable, match=r"vgpu\.io/gpu is its device plugin's"):
        mapped.scheduler.schedule(NAMESPACE, "classic")
    assert (
        "extendedResourceClaimStatus"
        not in mapped.api.store.get(POD, NAMESPACE, "classic")["status"]
    )
    mapped.template("small", [gpu_request(memory="1Gi")])
    mapped.pod("share", "small")  # claims still go to the driver there
    assert mapped.scheduler.schedule(NAMESPACE, "share") == NODE
