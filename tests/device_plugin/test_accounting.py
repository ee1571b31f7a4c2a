"""Per-GPU accounting through the kubelet's own steps over real gRPC: GetPreferredAllocation
places a pod's shares on GPUs that hold it, Allocate charges them or refuses with an event."""

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from vgpu_hypervisor.daemon.cluster import Charge
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.resources import gpu_of
from vgpu_hypervisor.device_plugin.server import DevicePlugin
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_hypervisor.kubernetes.annotations import ResourceNames

from tests.device_plugin.conftest import GiB, Node, gpu_pod, running_node, serving
from tests.device_plugin.kubelet import DeviceManager
from tests.device_plugin.test_device_plugin import allocate, region_limits, registered


def gpu_manager(node: Node) -> DeviceManager:
    return DeviceManager(node.kubelet, registered(node)["vgpu.io/gpu"])


def uuids(snapshot: NodeSnapshot) -> list[str]:
    return [str(device.uuid) for device in snapshot.devices]


def capacity(snapshot: NodeSnapshot) -> int:
    (total,) = {device.memory_total for device in snapshot.devices}
    assert isinstance(total, int)
    return total


def admit(
    node: Node,
    kubelet: DeviceManager,
    pod_name: str,
    gpus: int,
    *,
    memory: int = 0,
    compute: int = 0,
) -> list[str]:
    """The pod listed as pending, then one container admitted: its GPUs' UUIDs."""
    created = f"2026-01-01T00:00:{len(node.pods):02}Z"
    node.pods.append(gpu_pod(pod_name, gpus, created, memory=memory, compute=compute))
    ids, _ = kubelet.admit(gpus)
    return [gpu_of(one) for one in ids]


def test_only_the_gpu_resource_advertises_a_preferred_allocation(
    node: Node, plugin: DevicePlugin
) -> None:
    for name, request in registered(node).items():
        options = node.kubelet.plugin(request).GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        assert options.get_preferred_allocation_available == (name == "vgpu.io/gpu")


def test_a_two_gpu_pod_gets_two_distinct_gpus(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    kubelet = gpu_manager(node)
    given = admit(node, kubelet, "pair", 2, memory=4, compute=25)
    assert sorted(given) == sorted(uuids(snapshot))
    assert len(kubelet.preferred[0]) == 2  # the plugin's choice, not the kubelet's fallback
    charge = Charge(4 * GiB, 2500)
    assert plugin.ledger.committed() == {uuid: charge for uuid in uuids(snapshot)}
    assert set(region_limits(node, "pair")) == {uuid.lower() for uuid in uuids(snapshot)}


@pytest.mark.parametrize("placement", ["binpack", "spread"])
def test_filling_one_gpus_memory_spills_to_the_next(
    tmp_path: Path, snapshot: NodeSnapshot, placement: str
) -> None:
    """Sorted by UUID the node's GPUs are first and second. A pod of half a GPU's memory goes
    to the first (both empty), one of 60 % no longer fits there and goes to the second; one
    of 20 % fits both: binpack takes the second (20 % left after it), spread the first (30 %
    left). Each asks 10 % of compute: a pod asking none would be charged all of it."""
    first, second = sorted(uuids(snapshot))
    total_units = capacity(snapshot) // GiB
    with (
        running_node(tmp_path, snapshot) as node,
        serving(node, snapshot, placement=placement) as plugin,  # type: ignore[arg-type]
    ):
        kubelet = gpu_manager(node)
        tenth = total_units // 10
        assert admit(node, kubelet, "half", 1, memory=5 * tenth, compute=10) == [first]
        assert admit(node, kubelet, "sixty", 1, memory=6 * tenth, compute=10) == [second]
        small = admit(node, kubelet, "small", 1, memory=2 * tenth, compute=10)
        assert small == [second if placement == "binpack" else first]
        committed = plugin.ledger.committed()
        assert committed[first].memory + committed[second].memory == (5 + 6 + 2) * tenth * GiB
        assert not node.events


def test_a_gpu_only_pod_takes_a_whole_gpu_and_the_next_goes_to_the_other(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """With the defaults unset a bare vgpu.io/gpu is the whole GPU, charged whole: a small
    pod admitted after it goes to the other GPU, a third whole one fits nowhere."""
    kubelet = gpu_manager(node)
    (whole,) = admit(node, kubelet, "whole", 1)
    assert plugin.ledger.committed()[whole] == Charge(capacity(snapshot), 10000)
    (small,) = admit(node, kubelet, "small", 1, memory=1, compute=10)
    assert small != whole
    with pytest.raises(grpc.RpcError) as caught:
        admit(node, kubelet, "another", 1)  # no preference: the kubelet's pick is refused
    assert kubelet.preferred[-1] == []
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pod team/another: GPU " in str(caught.value.details())


def test_an_unfittable_choice_is_refused_with_an_event(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """The kubelet picks without asking (an older kubelet, or its own order): a share of a GPU
    that cannot hold the pod fails Allocate, saying why, on the pod's events too; nothing is
    charged for it, and the region is not made."""
    uuid = str(snapshot.devices[0].uuid)
    units = capacity(snapshot) // GiB
    request = registered(node)["vgpu.io/gpu"]
    node.pods[:] = [gpu_pod("big", 1, "2026-01-01T00:00:00Z", memory=units - 8, compute=50)]
    allocate(node, request, [f"{uuid}-0"])
    node.pods.append(gpu_pod("late", 1, "2026-01-01T00:00:01Z", memory=16, compute=10))
    with pytest.raises(grpc.RpcError) as caught:
        allocate(node, request, [f"{uuid}-1"])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    why = (
        f"pod team/late: GPU {uuid} cannot hold it: it asks 16 GiB and 10 % there, and "
        f"{units - 8} GiB and 50 % of the GPU's {units} GiB and 100 % are committed to 1 other "
        "pod(s)"
    )
    assert caught.value.details() == why
    assert node.events == [("team/late", "GpuDoesNotFit", why)]
    assert plugin.ledger.charged("uid-late") == {}
    assert node.store.scan() and [r.name for r in node.store.scan()] == ["big"]


def test_two_shares_of_one_gpu_for_one_container_are_refused(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    uuid = str(snapshot.devices[0].uuid)
    node.pods[:] = [gpu_pod("pair", 2, "2026-01-01T00:00:00Z", memory=1)]
    with pytest.raises(grpc.RpcError) as caught:
        allocate(node, registered(node)["vgpu.io/gpu"], [f"{uuid}-0", f"{uuid}-1"])
    assert caught.value.details() == (
        f"pod team/pair: the kubelet gave one container 2 shares of 1 GPU(s) ({uuid}); each "
        "GPU asked for must be another"
    )
    assert [reason for _, reason, _ in node.events] == ["GpuDoesNotFit"]


def test_a_pod_that_ended_gives_its_gpu_back(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    kubelet = gpu_manager(node)
    (whole,) = admit(node, kubelet, "whole", 1)
    node.pods[0] = gpu_pod("whole", 1, "2026-01-01T00:00:00Z", phase="Succeeded")
    assert plugin.ledger.committed()[whole] == Charge(0, 0)


@pytest.fixture
def defaults_node(tmp_path: Path, snapshot: NodeSnapshot) -> Iterator[Node]:
    names = ResourceNames(memory_unit=GiB, default_memory=8 * GiB, default_compute=2500)
    with running_node(tmp_path, snapshot, names) as made:
        yield made


def test_a_gpu_only_pod_gets_the_default_limits_and_is_charged_them(
    defaults_node: Node, snapshot: NodeSnapshot
) -> None:
    node = defaults_node
    with serving(node, snapshot) as plugin:
        kubelet = gpu_manager(node)
        (uuid,) = admit(node, kubelet, "plain", 1)
        assert region_limits(node, "plain") == {uuid.lower(): (8 * GiB, 25.0)}
        assert plugin.ledger.committed()[uuid] == Charge(8 * GiB, 2500)
        # Four such pods fill the GPU's compute: binpack puts them together, the fifth spills.
        given = [admit(node, kubelet, f"plain-{n}", 1)[0] for n in range(4)]
        assert given == [uuid, uuid, uuid, next(u for u in uuids(snapshot) if u != uuid)]
