"""Per-GPU accounting through the kubelet's own steps over real gRPC: GetPreferredAllocation
places a pod's shares on GPUs that hold it; the binder charges the pod once it knows it, or
refuses it (no region, an event) when the kubelet's choice cannot hold it."""

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon.cluster import Charge
from vgpu_hypervisor.device_plugin.binding import Allocation
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.server import DevicePlugin
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_hypervisor.kubernetes.annotations import ResourceNames

from tests.device_plugin.conftest import (
    GiB,
    Node,
    admit,
    allocation_of,
    gpu_pod,
    kubelet_pod,
    running_node,
    serving,
)
from tests.device_plugin.test_device_plugin import (
    container_environment,
    region_limits,
    registered,
    run_workload,
)

GPU = "vgpu.io/gpu"


def uuids(snapshot: NodeSnapshot) -> list[str]:
    return [str(device.uuid) for device in snapshot.devices]


def capacity(snapshot: NodeSnapshot) -> int:
    (total,) = {device.memory_total for device in snapshot.devices}
    assert isinstance(total, int)
    return total


def admitted(
    node: Node,
    plugin: DevicePlugin,
    pod_name: str,
    gpus: int,
    *,
    memory: int = 0,
    compute: int = 0,
    choose: list[str] | None = None,
) -> Allocation:
    """The pod listed as pending, then admitted by the kubelet (its own pick of ``choose``
    when given): its container's allocation once bound or refused."""
    created = f"2026-01-01T00:00:{len(node.pods):02}Z"
    pod = gpu_pod(pod_name, gpus, created, memory=memory, compute=compute)
    picked = None if choose is None else {("main", GPU): choose}
    answers = admit(node, plugin, pod, choose=picked)
    return allocation_of(plugin, answers["main"])


def admit_gpus(
    node: Node, plugin: DevicePlugin, pod_name: str, gpus: int, *, memory: int = 0, compute: int = 0
) -> list[str]:
    """As ``admitted``, for a pod that is bound: its GPUs' UUIDs."""
    allocation = admitted(node, plugin, pod_name, gpus, memory=memory, compute=compute)
    assert not allocation.refused, allocation.refused
    return allocation.gpus


def test_only_the_gpu_resource_advertises_a_preferred_allocation(
    node: Node, plugin: DevicePlugin
) -> None:
    for name, request in registered(node).items():
        options = node.kubelet.plugin(request).GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        assert options.get_preferred_allocation_available == (name == GPU)


def test_a_two_gpu_pod_gets_two_distinct_gpus(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    given = admit_gpus(node, plugin, "pair", 2, memory=4, compute=25)
    assert sorted(given) == sorted(uuids(snapshot))
    assert len(node.kubelet.preferred[0]) == 2  # the plugin's choice, not the kubelet's fallback
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
        tenth = total_units // 10
        assert admit_gpus(node, plugin, "half", 1, memory=5 * tenth, compute=10) == [first]
        assert admit_gpus(node, plugin, "sixty", 1, memory=6 * tenth, compute=10) == [second]
        small = admit_gpus(node, plugin, "small", 1, memory=2 * tenth, compute=10)
        assert small == [second if placement == "binpack" else first]
        committed = plugin.ledger.committed()
        assert committed[first].memory + committed[second].memory == (5 + 6 + 2) * tenth * GiB
        assert not node.events


def test_a_pod_admitted_before_its_binding_counts_when_the_next_is_placed(
    tmp_path: Path, snapshot: NodeSnapshot
) -> None:
    """The kubelet admits the second pod before the binder's next look at its list: placing it,
    GetPreferredAllocation binds the first pod first, so the second goes to the other GPU.
    (Before, within the binder's second the first pod's GPU still looked empty, the second was
    placed beside it and refused at binding.)"""
    tenth = capacity(snapshot) // GiB // 10
    with (
        running_node(tmp_path, snapshot) as node,
        serving(node, snapshot, bind_every_s=3600) as plugin,
    ):
        node.kubelet.connect()
        answers = []
        for name, created in (
            ("first", "2026-01-01T00:00:01Z"),
            ("second", "2026-01-01T00:00:02Z"),
        ):
            pod = gpu_pod(name, 1, created, memory=6 * tenth, compute=10)
            node.pods.append(pod)
            answers.append(node.kubelet.admit(kubelet_pod(pod))["main"])
        first, second = (allocation_of(plugin, answer) for answer in answers)
        assert first.pod == ("team", "first") and not first.refused
        assert second.gpus != first.gpus
        plugin.bindings.settle()
        assert allocation_of(plugin, answers[1]).pod == ("team", "second")
        assert not allocation_of(plugin, answers[1]).refused
        assert not node.events


def test_a_gpu_only_pod_takes_a_whole_gpu_and_the_next_goes_to_the_other(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """With the defaults unset a bare vgpu.io/gpu is the whole GPU, charged whole: a small
    pod admitted after it goes to the other GPU, a third whole one fits nowhere: the plugin
    prefers nothing, and the kubelet's own pick is refused at binding."""
    (whole,) = admit_gpus(node, plugin, "whole", 1)
    assert plugin.ledger.committed()[whole] == Charge(capacity(snapshot), 10000)
    (small,) = admit_gpus(node, plugin, "small", 1, memory=1, compute=10)
    assert small != whole
    another = admitted(node, plugin, "another", 1)
    assert node.kubelet.preferred[-1] == []
    assert another.refused.startswith("pod team/another: GPU ")
    assert [(key, reason) for key, reason, _ in node.events] == [("team/another", "GpuDoesNotFit")]


def test_an_unfittable_choice_is_refused_at_binding_with_an_event_and_no_region(
    node: Node,
    plugin: DevicePlugin,
    snapshot: NodeSnapshot,
    sim_state: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The kubelet picks without asking (an older kubelet, or its own order): a share of a GPU
    that cannot hold the pod is refused when the binder learns the pod, saying why on the
    pod's events and once in the log; nothing is charged for it, no region is made or linked
    (its container's processes fail after the wait), and it is not tried again."""
    caplog.set_level(logging.INFO, logger="vgpu_hypervisor.device_plugin")
    uuid = str(snapshot.devices[0].uuid)
    units = capacity(snapshot) // GiB
    admitted(node, plugin, "big", 1, memory=units - 8, compute=50, choose=[f"{uuid}-0"])
    pod = gpu_pod("late", 1, "2026-01-01T00:00:01Z", memory=16, compute=10)
    answer = admit(node, plugin, pod, choose={("main", GPU): [f"{uuid}-1"]})["main"]
    late = allocation_of(plugin, answer)
    why = (
        f"pod team/late: GPU {uuid} cannot hold it: it asks 16 GiB and 10 % there, and "
        f"{units - 8} GiB and 50 % of the GPU's {units} GiB and 100 % are committed to 1 other "
        "pod(s)"
    )
    assert late.refused == why and late.pod == ("team", "late")
    time.sleep(1)  # several binder passes
    assert node.events == [("team/late", "GpuDoesNotFit", why)]
    assert plugin.ledger.charged("uid-late") == {}
    assert [r.name for r in node.store.scan()] == ["big"]
    assert not (plugin.bindings.path(late.id) / "shm").exists()
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert said == [f"allocation {late.id} refused, no region linked: {why}"]
    environment = container_environment(answer, sim_state) | {"TF_REGION_WAIT": "1"}
    failed = run_workload(environment, "1GiB")
    assert str(failed["error"]).startswith("CUDA_ERROR_NOT_INITIALIZED"), failed
    (line,) = [one for one in str(failed["stderr"]).splitlines() if "TF_REGION_WAIT" in one]
    assert "no pod region after 1 s" in line


def test_two_shares_of_one_gpu_for_one_container_are_refused(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    uuid = str(snapshot.devices[0].uuid)
    pair = admitted(node, plugin, "pair", 2, memory=1, choose=[f"{uuid}-0", f"{uuid}-1"])
    assert pair.refused == (
        f"pod team/pair: the kubelet gave one container 2 shares of 1 GPU(s) ({uuid}); each "
        "GPU asked for must be another"
    )
    assert [reason for _, reason, _ in node.events] == ["GpuDoesNotFit"]
    assert not node.store.scan()


def test_a_pod_that_ended_gives_its_gpu_back(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    (whole,) = admit_gpus(node, plugin, "whole", 1)
    node.pods[0] = gpu_pod("whole", 1, "2026-01-01T00:00:00Z", phase="Succeeded")
    assert plugin.ledger.committed()[whole] == Charge(0, 0)


def test_charges_and_refusals_outlive_a_daemon_restart(node: Node, snapshot: NodeSnapshot) -> None:
    """A restarted plugin still counts what it charged, and does not refuse (nor tell) a
    refused pod again."""
    uuid = str(snapshot.devices[0].uuid)
    units = capacity(snapshot) // GiB
    with serving(node, snapshot) as plugin:
        admitted(node, plugin, "big", 1, memory=units - 8, compute=50, choose=[f"{uuid}-0"])
        late = admitted(node, plugin, "late", 1, memory=16, compute=10, choose=[f"{uuid}-1"])
        assert late.refused
    with serving(node, snapshot) as again:
        assert again.ledger.committed()[uuid] == Charge((units - 8) * GiB, 5000)
        kept = again.bindings.get(late.id)
        assert kept is not None and kept.refused == late.refused
        time.sleep(1)  # several binder passes
        assert len(node.events) == 1


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
        (uuid,) = admit_gpus(node, plugin, "plain", 1)
        assert region_limits(node, "plain") == {uuid.lower(): (8 * GiB, 25.0)}
        assert plugin.ledger.committed()[uuid] == Charge(8 * GiB, 2500)
        # Four such pods fill the GPU's compute: binpack puts them together, the fifth spills.
        given = [admit_gpus(node, plugin, f"plain-{n}", 1)[0] for n in range(4)]
        assert given == [uuid, uuid, uuid, next(u for u in uuids(snapshot) if u != uuid)]
