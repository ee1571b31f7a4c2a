"""The node's ResourceSlice: built from the simulated node, valid against the published
resource.k8s.io/v1 schemas of Kubernetes 1.34 to 1.37, published through a real client and
replaced (never duplicated) across restarts and health changes."""

from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import pytest
from vgpu_hypervisor.dra.inventory import NodeFacts
from vgpu_hypervisor.dra.kube import KubeError, open_client
from vgpu_hypervisor.dra.publish import SlicePublisher
from vgpu_hypervisor.dra.slices import node_slice, semver

from tests.dra.conftest import NODE, SLICES, objects
from tests.support.apiserver import ApiServer


@pytest.mark.parametrize("version", ["1.34.0", "1.35.0", "1.36.0", "1.37.0"])
def test_the_slice_validates_against_the_published_schema(facts: NodeFacts, version: str) -> None:
    body = node_slice(NODE, facts, {gpu.uuid for gpu in facts.gpus}, 1)
    kubernetes_validate.validate(body, version, strict=True)
    tainted = node_slice(NODE, facts, {facts.gpus[0].uuid}, 1, taint=True)
    assert [bool(d.get("taints")) for d in tainted["spec"]["devices"]] == [False, True]
    kubernetes_validate.validate(tainted, version, strict=True)


def test_one_shared_device_per_gpu_with_capacities_and_attributes(facts: NodeFacts) -> None:
    assert len(facts.gpus) == 2
    first = facts.gpus[0]
    body = node_slice(NODE, facts, {first.uuid}, 3)  # the second GPU is unhealthy
    spec = body["spec"]
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    (device,) = spec["devices"]
    assert device["name"] == "gpu-0" and device["allowMultipleAllocations"] is True
    assert device["attributes"]["uuid"] == {"string": first.uuid}
    assert device["attributes"]["index"] == {"int": 0}
    assert device["attributes"]["productName"] == {"string": first.name}
    for key in ("computeCapability", "driverVersion", "cudaVersion"):
        assert "version" in device["attributes"][key], key
    memory = device["capacity"]["memory"]
    assert memory["value"] == str(first.memory)
    assert memory["requestPolicy"]["validRange"]["step"] == str(1 << 20)
    assert device["capacity"]["compute"]["requestPolicy"] == {
        "default": "100",
        "validRange": {"min": "1", "max": "100", "step": "1"},
    }


def test_versions_are_written_as_semver() -> None:
    assert semver("580.65.06") == "580.65.6"
    assert semver("13.0") == "13.0.0"
    assert semver("9.0") == "9.0.0"
    assert semver("") is None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ApiServer, Path]]:
    with ApiServer() as api:
        yield api, api.kubeconfig(tmp_path / "kubeconfig")


def test_published_once_replaced_on_change_and_never_duplicated(
    server: tuple[ApiServer, Path], facts: NodeFacts
) -> None:
    api, config = server
    uuids = [gpu.uuid for gpu in facts.gpus]
    # A slice an older daemon left under another name: it goes.
    stale = node_slice(NODE, facts, set(uuids), 1)
    stale["metadata"]["name"] = "node-1-gpu.vgpu.io-old"
    api.store.put(SLICES, None, stale)
    publisher = SlicePublisher(open_client(str(config)), NODE, facts)
    assert publisher.publish(uuids)
    assert not publisher.publish(reversed(uuids))  # nothing changed: nothing written
    (only,) = objects(api, SLICES)
    assert only["metadata"]["name"] == "node-1-gpu.vgpu.io"
    assert len(only["spec"]["devices"]) == 2

    # The first GPU became unhealthy: tainted, which this API server (1.34, DRADeviceTaints off)
    # drops; so written again without it.
    assert publisher.publish(uuids[1:])
    (only,) = objects(api, SLICES)
    assert [d["name"] for d in only["spec"]["devices"]] == ["gpu-1"]
    assert only["spec"]["pool"]["generation"] == 3

    restarted = SlicePublisher(open_client(str(config)), NODE, facts)
    assert restarted.publish(uuids)
    (only,) = objects(api, SLICES)
    assert only["spec"]["pool"]["generation"] == 4 and len(only["spec"]["devices"]) == 2
    restarted.remove()
    assert objects(api, SLICES) == []


def test_an_unreachable_api_server_is_one_line(tmp_path: Path, facts: NodeFacts) -> None:
    with ApiServer() as api:
        config = api.kubeconfig(tmp_path / "kubeconfig")
    # Stopped: nothing listens there any more.
    publisher = SlicePublisher(open_client(str(config)), NODE, facts)
    with pytest.raises(KubeError, match=r"^ResourceSlice node-1-gpu.vgpu.io: ") as caught:
        publisher.publish([gpu.uuid for gpu in facts.gpus])
    assert "\n" not in str(caught.value)


def test_the_slice_is_owned_by_its_node(
    server: tuple[ApiServer, Path], facts: NodeFacts, caplog: pytest.LogCaptureFixture
) -> None:
    """As the kubelet's DRA helpers make it: deleting the Node deletes its slice (garbage
    collection), so no claim is placed on GPUs of a node that is gone."""
    api, config = server
    node = api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    publisher = SlicePublisher(open_client(str(config)), NODE, facts)
    assert publisher.publish([gpu.uuid for gpu in facts.gpus])
    (only,) = objects(api, SLICES)
    assert only["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }
    ]
    assert "without its Node" not in caplog.text


def test_a_node_that_cannot_be_read_leaves_the_slice_without_owner_said_once(
    server: tuple[ApiServer, Path], facts: NodeFacts, caplog: pytest.LogCaptureFixture
) -> None:
    api, config = server
    publisher = SlicePublisher(open_client(str(config)), NODE, facts)
    uuids = [gpu.uuid for gpu in facts.gpus]
    assert publisher.publish(uuids)
    assert publisher.publish(uuids[1:])
    (only,) = objects(api, SLICES)
    assert "ownerReferences" not in only["metadata"]
    warnings = [r.getMessage() for r in caplog.records if "without its Node" in r.getMessage()]
    assert len(warnings) == 1 and f"node {NODE}: " in warnings[0], warnings


@pytest.mark.parametrize("version", ["1.34.0", "1.37.0"])
def test_an_unhealthy_gpu_is_tainted_where_the_api_server_keeps_device_taints(
    tmp_path: Path, facts: NodeFacts, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    with ApiServer(version=version, feature_gates={"DRADeviceTaints": True}) as api:
        publisher = SlicePublisher(open_client(str(api.kubeconfig(tmp_path / "k"))), NODE, facts)
        uuids = [gpu.uuid for gpu in facts.gpus]
        assert publisher.publish(uuids[1:])
        (only,) = objects(api, SLICES)
        taints = {d["name"]: d.get("taints") for d in only["spec"]["devices"]}
        assert taints == {
            "gpu-0": [{"key": "gpu.vgpu.io/unhealthy", "effect": "NoSchedule"}],
            "gpu-1": None,
        }
        assert only["spec"]["pool"]["generation"] == 1
        kubernetes_validate.validate(only, version, strict=True)  # raises when invalid
        assert publisher.publish(uuids)  # healthy again: untainted
        (only,) = objects(api, SLICES)
        assert [d.get("taints") for d in only["spec"]["devices"]] == [None, None]
    assert "drops device taints" not in caplog.text


def test_where_taints_are_dropped_unhealthy_gpus_leave_the_slice_said_once(
    server: tuple[ApiServer, Path], facts: NodeFacts, caplog: pytest.LogCaptureFixture
) -> None:
    api, config = server  # 1.34 without the DRADeviceTaints feature gate
    publisher = SlicePublisher(open_client(str(config)), NODE, facts)
    uuids = [gpu.uuid for gpu in facts.gpus]
    assert publisher.publish(uuids[1:])
    assert publisher.publish(uuids)
    assert publisher.publish(uuids[:1])  # no taint tried again: one write
    (only,) = objects(api, SLICES)
    assert [d["name"] for d in only["spec"]["devices"]] == ["gpu-0"]
    assert only["spec"]["pool"]["generation"] == 4
    said = [r for r in caplog.records if "drops device taints" in r.getMessage()]
    assert len(said) == 1 and not publisher.taints
