"""Each allocation is bound to the pod the kubelet gave its devices to (PodResources), never
guessed: pods of one shape in either order, a daemon restart between allocations, init
containers and sidecars, a container started before its binding, a tenant's planted files."""

import dataclasses
import json
import subprocess
import time
from pathlib import Path

from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.server import DevicePlugin
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_limiter import sim

from tests.device_plugin.conftest import (
    GiB,
    Node,
    admit,
    allocation_of,
    gpu_pod,
    kubelet_pod,
    serving,
    wait_bound,
)
from tests.device_plugin.kubelet import Container
from tests.device_plugin.test_device_plugin import (
    container_environment,
    region_limits,
    run_workload,
)
from tests.hypervisor.conftest import wait_for


def linked_region(
    node: Node, plugin: DevicePlugin, answer: api_pb2.ContainerAllocateResponse
) -> int:
    """The inode of the region the container's folder holds."""
    return (plugin.bindings.path(allocation_of(plugin, answer).id) / "shm").stat().st_ino


def region_inode(node: Node, name: str) -> int:
    return node.store.get("team", name).path.stat().st_ino


def test_two_pods_of_one_shape_admitted_in_reverse_order_each_get_their_own_region(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot, sim_state: object
) -> None:
    """The younger pod is admitted first. (The oldest-pending-pod guess gave it the older
    pod's limits and folder, and the other way round.)"""
    gpu = str(snapshot.devices[0].uuid)
    uuid = gpu.lower()
    older = gpu_pod("older", 1, "2026-01-01T00:00:05Z", memory=2, compute=30)
    younger = gpu_pod("younger", 1, "2026-01-01T00:00:09Z", memory=4, compute=50)
    node.pods[:] = [older, younger]
    first = admit(node, plugin, younger)["main"]
    second = admit(node, plugin, older)["main"]

    assert allocation_of(plugin, first).pod == ("team", "younger")
    assert allocation_of(plugin, second).pod == ("team", "older")
    assert linked_region(node, plugin, first) == region_inode(node, "younger")
    assert linked_region(node, plugin, second) == region_inode(node, "older")
    assert region_limits(node, "younger") == {uuid: (4 * GiB, 50.0)}
    assert region_limits(node, "older") == {uuid: (2 * GiB, 30.0)}
    assert plugin.assigned("uid-younger") == plugin.assigned("uid-older") == (gpu,)
    # Each container runs under its own pod's limit.
    for answer, limit in ((first, 4 * GiB), (second, 2 * GiB)):
        report = run_workload(container_environment(answer, sim_state), "1GiB")
        assert report.get("error") is None, report
        assert report["total_bytes"] == limit


def test_a_daemon_restart_between_allocations_binds_each_to_its_own_pod(
    node: Node, snapshot: NodeSnapshot
) -> None:
    """Pod a is bound by one daemon; pod b is admitted after it restarted, and pod c while the
    kubelet's PodResources was down, so that the next daemon binds it. (The guess matched a
    new pod to an old pending one after a restart, and gave it that pod's limits.)"""
    # Each asks 30 % of compute, so that one GPU holds the three (asking none, each would be
    # charged the GPU's whole time).
    pod_a = gpu_pod("a", 1, "2026-01-01T00:00:01Z", memory=2, compute=30)
    pod_b = gpu_pod("b", 1, "2026-01-01T00:00:02Z", memory=3, compute=30)
    pod_c = gpu_pod("c", 1, "2026-01-01T00:00:03Z", memory=5, compute=30)
    node.pods[:] = [pod_a, pod_b, pod_c]  # all pending: the guess could take any
    with serving(node, snapshot) as first:
        answer_a = admit(node, first, pod_a)["main"]
        id_a = allocation_of(first, answer_a).id
    with serving(node, snapshot) as second:
        node.kubelet.connect()  # its registrations, as after any plugin restart
        assert (kept := second.bindings.get(id_a)) is not None and kept.pod == ("team", "a")
        assert second.assigned("uid-a") == (str(snapshot.devices[0].uuid),)
        answer_b = admit(node, second, pod_b)["main"]
        node.kubelet.pod_resources_down = True
        answer_c = node.kubelet.admit(kubelet_pod(pod_c))["main"]
        assert allocation_of(second, answer_c).pod is None
    node.kubelet.pod_resources_down = False
    with serving(node, snapshot) as third:
        node.kubelet.connect()
        wait_bound(third, {"main": answer_c})
        for answer, name, memory in ((answer_a, "a", 2), (answer_b, "b", 3), (answer_c, "c", 5)):
            assert allocation_of(third, answer).pod == ("team", name)
            assert linked_region(node, third, answer) == region_inode(node, name)
            (limits,) = region_limits(node, name).values()
            assert limits[0] == memory * GiB
    saved = json.loads((node.layout.host_base / ".kubernetes" / "allocations.json").read_text())
    assert sorted(entry["pod"][1] for entry in saved["allocations"]) == ["a", "b", "c"]
    assert (node.layout.host_base / ".kubernetes").stat().st_mode & 0o777 == 0o700


def test_a_gpu_init_container_and_a_sidecar_share_their_pods_region(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot, sim_state: object
) -> None:
    """A plain init container, a sidecar (restartPolicy: Always) and the main container each
    ask for a GPU: admission succeeds (the guess refused it), each gets its own folder, all
    three hold the pod's one region. The kubelet lists no plain init container: its device
    shows under the next container asking for one, the sidecar, which it gave that device
    again (as the kubelet's device manager does)."""
    pod = gpu_pod("staged", 1, "2026-01-01T00:00:00Z", memory=2, compute=20)
    init = (
        Container("warmup", {"vgpu.io/gpu": 1}, init=True),
        Container("proxy", {"vgpu.io/gpu": 1}, init=True, sidecar=True),
    )
    answers = admit(node, plugin, pod, init)
    assert set(answers) == {"warmup", "proxy", "main"}
    allocations = {name: allocation_of(plugin, answer) for name, answer in answers.items()}
    assert len({a.id for a in allocations.values()}) == 3
    assert {a.pod for a in allocations.values()} == {("team", "staged")}
    assert allocations["warmup"].devices == allocations["proxy"].devices  # reused
    assert allocations["proxy"].devices != allocations["main"].devices
    assert (allocations["proxy"].container, allocations["main"].container) == ("proxy", "main")
    assert "proxy" in allocations["warmup"].container  # seen through the sidecar
    region = region_inode(node, "staged")
    assert {linked_region(node, plugin, answer) for answer in answers.values()} == {region}
    # One pod, one quota: the init container's program sees the pod's limit.
    report = run_workload(container_environment(answers["warmup"], sim_state), "1GiB")
    assert report.get("error") is None, report
    assert report["total_bytes"] == 2 * GiB


def _start_workload(environment: dict[str, str], size: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(sim.workload_path()), "--kernels", "1", "--alloc", size],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_container_started_before_its_binding_waits_for_it_or_fails_with_one_line(
    node: Node, plugin: DevicePlugin, sim_state: object
) -> None:
    """The kubelet's PodResources is down when the container starts: its process waits
    (TF_REGION_WAIT, as Allocate set it) and runs under the pod's limit once the daemon bound
    the allocation; with a wait that ends first it fails CUDA's initialization, one line."""
    pod = gpu_pod("patient", 1, "2026-01-01T00:00:00Z", memory=2)
    node.pods.append(pod)
    node.kubelet.connect()
    node.kubelet.pod_resources_down = True
    answer = node.kubelet.admit(kubelet_pod(pod))["main"]
    environment = container_environment(answer, sim_state)
    assert environment["TF_REGION_WAIT"] == "60"

    short = run_workload(environment | {"TF_REGION_WAIT": "1"}, "1GiB")
    assert str(short["error"]).startswith("CUDA_ERROR_NOT_INITIALIZED"), short
    (line,) = [one for one in str(short["stderr"]).splitlines() if "TF_REGION_WAIT" in one]
    assert "no pod region after 1 s: the node daemon has not bound this container's GPUs" in line

    waiting = _start_workload(environment, "3GiB")
    wait_for(lambda: allocation_of(plugin, answer).pod is None and waiting.poll() is None)
    node.kubelet.pod_resources_down = False
    stdout, stderr = waiting.communicate(timeout=60)
    assert json.loads(stdout)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", stderr
    assert allocation_of(plugin, answer).pod == ("team", "patient")


def test_files_a_tenant_planted_in_its_folder_are_replaced_never_followed(
    node: Node, plugin: DevicePlugin, tmp_path: Path
) -> None:
    """A root container writes its own folder: before the binding it puts a symbolic link to
    another file where the region goes, and one where the daemon makes its new link. The
    daemon's rename replaces them; neither target is opened, changed or linked."""
    victim = tmp_path / "victim"
    victim.write_text("not yours")
    pod = gpu_pod("planter", 1, "2026-01-01T00:00:00Z", memory=2)
    node.pods.append(pod)
    node.kubelet.connect()
    node.kubelet.pod_resources_down = True
    answer = node.kubelet.admit(kubelet_pod(pod))["main"]
    folder = plugin.bindings.path(allocation_of(plugin, answer).id)
    (folder / "shm").symlink_to(victim)
    (folder / ".shm.new").symlink_to(victim)
    node.kubelet.pod_resources_down = False
    wait_bound(plugin, {"main": answer})

    assert not (folder / "shm").is_symlink()
    assert (folder / "shm").stat().st_ino == region_inode(node, "planter")
    assert not (folder / ".shm.new").exists()
    assert victim.read_text() == "not yours"
    assert victim.stat().st_nlink == 1


def test_an_allocation_whose_pod_is_gone_is_removed_with_its_folder(
    node: Node, plugin: DevicePlugin
) -> None:
    """Neither the kubelet nor the pod source has the pod any more: after ``forget_s`` the
    allocation and its folder go (the pod's region is the pod source's to remove); the kept
    file forgets it too."""
    pod = gpu_pod("brief", 1, "2026-01-01T00:00:00Z", memory=2)
    answer = admit(node, plugin, pod)["main"]
    allocation = allocation_of(plugin, answer)
    folder = plugin.bindings.path(allocation.id)
    node.kubelet.remove(kubelet_pod(pod))
    node.pods.remove(pod)
    wait_for(lambda: plugin.bindings.get(allocation.id) is None and not folder.exists())
    assert node.store.get("team", "brief").path.exists()
    saved = json.loads((node.layout.host_base / ".kubernetes" / "allocations.json").read_text())
    assert saved == {"allocations": []}


def test_a_pod_the_kubelet_stops_listing_keeps_its_allocation_while_the_pod_source_has_it(
    node: Node, plugin: DevicePlugin
) -> None:
    """A kubelet restarted while the API server is out of reach lists no pod, though their
    containers run on: the allocation, its folder and the region's link in it stay while the
    pod source still has the pod, however long (they went after ``forget_s``, under the
    running container). Once the pod has ended they go as usual."""
    pod = gpu_pod("steady", 1, "2026-01-01T00:00:00Z", memory=2)
    answer = admit(node, plugin, pod)["main"]
    allocation = allocation_of(plugin, answer)
    folder = plugin.bindings.path(allocation.id)
    with node.kubelet.lock:
        listed = dict(node.kubelet.admitted)
        node.kubelet.admitted.clear()
    lists, since = node.kubelet.lists, time.monotonic()
    # The binder looked several times, well past forget_s (or forgot it).
    wait_for(
        lambda: (
            plugin.bindings.get(allocation.id) is None
            or (
                node.kubelet.lists >= lists + 5
                and time.monotonic() - since > 4 * plugin.config.forget_s
            )
        ),
        timeout=30,
    )
    assert plugin.bindings.get(allocation.id) is not None
    assert linked_region(node, plugin, answer) == region_inode(node, "steady")

    with node.kubelet.lock:
        node.kubelet.admitted.update(listed)  # the kubelet lists it again: nothing changed
    wait_for(lambda: node.kubelet.lists >= lists + 10)
    assert linked_region(node, plugin, answer) == region_inode(node, "steady")
    node.pods[:] = [dataclasses.replace(pod, phase="Succeeded")]
    node.kubelet.remove(kubelet_pod(pod))
    wait_for(lambda: plugin.bindings.get(allocation.id) is None and not folder.exists())
