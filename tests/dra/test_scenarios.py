"""Claims from the user's objects to the pod's region, as in a cluster: the DeviceClass and
claim templates of deploy/kubernetes/dra in the API-server stand-in, the node's ResourceSlice
published by the driver, pods scheduled by the stand-in for the scheduler (allocator.py), and
the stand-in kubelet preparing their claims over real gRPC, on the simulated GPU."""

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.dra.inventory import NodeFacts
from vgpu_hypervisor.dra.kube import open_client
from vgpu_hypervisor.dra.publish import SlicePublisher
from vgpu_hypervisor.dra.runner import DraRunning
from vgpu_hypervisor.gpu import NodeSnapshot

from tests.dra.allocator import Scheduler
from tests.dra.conftest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    DEVICE_CLASSES,
    NAMESPACE,
    NODE,
    DraNode,
    GiB,
    objects,
)
from tests.dra.kubelet import DraKubelet, Plugin, stop_pod
from tests.dra.test_driver import region_limits
from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import POD

DRA = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "dra"
MiB = 1 << 20


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DRA / name).read_text()) if d]


@dataclasses.dataclass
class Users:
    """What users do through the API server: claim templates, pods, their claims read back."""

    api: ApiServer

    def install(self) -> None:
        """The DeviceClass and the example claim templates of deploy/kubernetes/dra."""
        for document in documents("deviceclass.yaml"):
            self.api.store.create(DEVICE_CLASSES, None, document, strict=True, dry_run=False)
        for document in documents("examples.yaml"):
            if document["kind"] == "ResourceClaimTemplate":
                self.api.store.create(
                    CLAIM_TEMPLATES, NAMESPACE, document, strict=True, dry_run=False
                )

    def template(self, name: str, requests: list[dict[str, Any]], **devices: Any) -> None:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests, **devices}}},
        }
        self.api.store.create(CLAIM_TEMPLATES, NAMESPACE, body, strict=True, dry_run=False)

    def pod(self, name: str, *templates: str) -> dict[str, Any]:
        """A pending pod whose claims (named after their templates) come from ``templates``."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": t, "resourceClaimTemplateName": t} for t in templates],
                "containers": [
                    {"name": "main", "image": "cuda",
                     "resources": {"claims": [{"name": t} for t in templates]}}
                ],
            },
        }  # fmt: skip
        created, _ = self.api.store.create(POD, NAMESPACE, body, strict=True, dry_run=False)
        return created

    def claims_of(self, pod: str) -> list[dict[str, Any]]:
        found = self.api.store.get(POD, NAMESPACE, pod)
        names = [s["resourceClaimName"] for s in found["status"]["resourceClaimStatuses"]]
        return [self.api.store.get(CLAIMS, NAMESPACE, n) for n in names]


@dataclasses.dataclass
class Cluster(Users):
    dra: DraNode
    running: DraRunning
    scheduler: Scheduler


def gpu_request(name: str = "gpu", **capacity: str) -> dict[str, Any]:
    exact: dict[str, Any] = {"deviceClassName": "gpu.vgpu.io"}
    if capacity:
        exact["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exact}


def placed(claim: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    results = claim["status"]["allocation"]["devices"]["results"]
    return [(r["device"], r["consumedCapacity"]) for r in results]


def prepare_pod(plugin: Plugin, cluster: Cluster, pod: str) -> list[Any]:
    claims = cluster.claims_of(pod)
    refs = [(NAMESPACE, c["metadata"]["name"], c["metadata"]["uid"]) for c in claims]
    answer = plugin.prepare(*refs)
    answers = [answer.claims[uid] for _, _, uid in refs]
    assert [a.error for a in answers] == [""] * len(answers), answers
    return answers


@pytest.fixture
def cluster(dra: DraNode, facts: NodeFacts, snapshot: NodeSnapshot) -> Cluster:
    api = dra.api
    assert dra.driver is not None
    client = open_client(str(api.kubeconfig(dra.node.root / "publisher")))
    running = DraRunning(dra.driver, SlicePublisher(client, NODE, facts), facts)
    running.update_health(snapshot)
    made = Cluster(api, dra, running, Scheduler(api))
    made.install()
    return made


def test_three_claims_fill_one_gpu_and_the_fourth_goes_to_the_second(
    cluster: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    first, second = facts.gpus
    third = first.memory // 3 // MiB  # MiB: three fit, a fourth does not
    cluster.template("third", [gpu_request(memory=f"{third}Mi", compute="30")])
    for index in range(4):
        cluster.pod(f"p{index}", "third")
        assert cluster.scheduler.schedule(NAMESPACE, f"p{index}") == NODE
    devices = [placed(c) for p in range(4) for c in cluster.claims_of(f"p{p}")]
    share = {"memory": str(third * MiB), "compute": "30"}
    assert devices == [[("gpu-0", share)]] * 3 + [[("gpu-1", share)]]
    for index in range(4):
        prepare_pod(plugin, cluster, f"p{index}")
    gpu = [first.uuid] * 3 + [second.uuid]
    for index in range(4):
        assert region_limits(cluster.dra, f"p{index}") == {
            gpu[index]: GpuLimits(memory=third * MiB, compute=3000)
        }


def test_a_claim_of_two_gpus(cluster: Cluster, plugin: Plugin, facts: NodeFacts) -> None:
    cluster.pod("pair", "two-gpus-8gi")  # the example template: distinct GPUs, 8 GiB each
    cluster.scheduler.schedule(NAMESPACE, "pair")
    (claim,) = cluster.claims_of("pair")
    whole = {"compute": "100"}  # no compute asked: the policy's default
    assert placed(claim) == [
        ("gpu-0", {"memory": str(8 * GiB), **whole}),
        ("gpu-1", {"memory": str(8 * GiB), **whole}),
    ]
    ((answer,),) = [prepare_pod(plugin, cluster, "pair")]
    assert sorted(d.device_name for d in answer.devices) == ["gpu-0", "gpu-1"]
    assert region_limits(cluster.dra, "pair") == {
        gpu.uuid: GpuLimits(memory=8 * GiB, compute=None) for gpu in facts.gpus
    }


def test_a_daemon_restart_between_prepare_and_unprepare(
    cluster: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    cluster.pod("kept", "gpu-4gi-30")
    cluster.scheduler.schedule(NAMESPACE, "kept")
    (before,) = prepare_pod(plugin, cluster, "kept")
    assert region_limits(cluster.dra, "kept") == {
        facts.gpus[0].uuid: GpuLimits(memory=4 * GiB, compute=3000, burst=6000)
    }
    cluster.dra.stop()
    cluster.dra.start()
    kubelet = DraKubelet(cluster.dra.sockets.registry)
    try:
        again = kubelet.register()
        (claim,) = cluster.claims_of("kept")
        ref = (NAMESPACE, claim["metadata"]["name"], claim["metadata"]["uid"])
        assert again.prepare(ref).claims[ref[2]] == before  # answered from the checkpoint
        assert again.unprepare(ref).claims[ref[2]].error == ""
    finally:
        kubelet.close()
    assert cluster.dra.node.store.scan() == []
    assert list(cluster.dra.cdi_dir.iterdir()) == []


def test_two_claims_of_one_pod_share_its_quota(
    cluster: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    cluster.template("small", [gpu_request(memory="1Gi", compute="10")])
    cluster.pod("both", "gpu-4gi-30", "small")
    cluster.scheduler.schedule(NAMESPACE, "both")
    claims = cluster.claims_of("both")
    assert [placed(c)[0][0] for c in claims] == ["gpu-0", "gpu-0"]
    uid = cluster.api.store.get(POD, NAMESPACE, "both")["metadata"]["uid"]
    for claim in claims:
        assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "both", "uid": uid}]
    prepare_pod(plugin, cluster, "both")
    # The burst: the 30 % claim's 60 plus the 10 % of the one that sets none.
    assert region_limits(cluster.dra, "both") == {
        facts.gpus[0].uuid: GpuLimits(memory=5 * GiB, compute=4000, burst=7000)
    }


def test_claims_are_released_as_the_claim_controller_does_when_pods_end(
    cluster: Cluster, plugin: Plugin
) -> None:
    api, scheduler = cluster.api, cluster.scheduler
    shared = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared"},
        "spec": {"devices": {"requests": [gpu_request(memory="1Gi", compute="10")]}},
    }
    api.store.create(CLAIMS, NAMESPACE, shared, strict=True, dry_run=False)
    for name in ("a", "b"):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
                "containers": [{"name": "main", "image": "cuda",
                                "resources": {"claims": [{"name": "gpu"}]}}],
            },
        }  # fmt: skip
        api.store.create(POD, NAMESPACE, body, strict=True, dry_run=False)
        assert scheduler.schedule(NAMESPACE, name) == NODE
    cluster.pod("own", "gpu-4gi-30")
    assert scheduler.schedule(NAMESPACE, "own") == NODE
    (own,) = cluster.claims_of("own")
    # Pending (its claim made by the claim controller), deleted before it is placed.
    (pending,) = scheduler.claims_of(cluster.pod("never", "gpu-4gi-30"))

    def shared_status() -> dict[str, Any]:
        status: dict[str, Any] = api.store.get(CLAIMS, NAMESPACE, "shared")["status"]
        return status

    assert [c["name"] for c in shared_status()["reservedFor"]] == ["a", "b"]
    assert scheduler.release_claims() == []  # every pod still there

    api.store.delete(POD, NAMESPACE, "a")  # being deleted: its node has not stopped it yet
    assert scheduler.release_claims() == []
    assert [c["name"] for c in shared_status()["reservedFor"]] == ["a", "b"]
    stop_pod(api, plugin, NAMESPACE, "a")  # gone: the reservation goes, b keeps the claim
    api.store.delete(POD, NAMESPACE, "never")  # never bound: gone at once
    assert scheduler.release_claims() == [pending["metadata"]["name"]]
    assert [c["name"] for c in shared_status()["reservedFor"]] == ["b"]
    assert "allocation" in shared_status()

    ended = api.store.get(POD, NAMESPACE, "b")
    ended["status"]["phase"] = "Succeeded"  # b ended: the claim is deallocated, and stays
    api.store.put(POD, NAMESPACE, ended)
    ended = api.store.get(POD, NAMESPACE, "own")
    ended["status"]["phase"] = "Failed"  # own ended: its own claim is deleted
    api.store.put(POD, NAMESPACE, ended)
    assert scheduler.release_claims() == [own["metadata"]["name"]]
    assert shared_status() == {}
    assert [c["metadata"]["name"] for c in objects(api, CLAIMS, NAMESPACE)] == ["shared"]


def test_a_claim_of_two_requests_placed_on_one_gpu_is_prepared_with_a_valid_spec(
    cluster: Cluster, plugin: Plugin, facts: NodeFacts
) -> None:
    """The scheduler may give two requests of one claim the same shared GPU. Before, the
    claim's CDI spec named that GPU's device twice, which CDI refuses whole."""
    requests = [gpu_request("train", memory="2Gi", compute="20"),
                gpu_request("serve", memory="1Gi", compute="10")]  # fmt: skip
    cluster.template("two-requests", requests)
    cluster.pod("duo", "two-requests")
    assert cluster.scheduler.schedule(NAMESPACE, "duo") == NODE
    (claim,) = cluster.claims_of("duo")
    assert [device for device, _ in placed(claim)] == ["gpu-0", "gpu-0"]
    (answer,) = prepare_pod(plugin, cluster, "duo")
    assert sorted(r for d in answer.devices for r in d.request_names) == ["serve", "train"]
    spec = cluster.dra.cdi_dir / f"gpu.vgpu.io-claim_{claim['metadata']['uid']}.json"
    names = [device["name"] for device in yaml.safe_load(spec.read_text())["devices"]]
    assert len(names) == len(set(names)) == 2
    assert region_limits(cluster.dra, "duo") == {
        facts.gpus[0].uuid: GpuLimits(memory=3 * GiB, compute=3000)
    }
