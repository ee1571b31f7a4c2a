"""The device plugin against a stand-in kubelet over real gRPC, on the simulated GPU."""

import dataclasses
import json
import logging
import subprocess
from pathlib import Path

import grpc
import pytest
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.server import DevicePlugin
from vgpu_hypervisor.gpu import NOT_AVAILABLE, NodeSnapshot
from vgpu_hypervisor.kubernetes.annotations import Kind
from vgpu_limiter import sim

from tests.device_plugin.conftest import (
    SHARES,
    GiB,
    Node,
    admit,
    allocation_of,
    gpu_pod,
    kubelet_pod,
    wait_bound,
)
from tests.device_plugin.kubelet import Watch
from tests.hypervisor.conftest import clean_environment, wait_for

RESOURCES = {"vgpu.io/gpu", "vgpu.io/gpu-memory", "vgpu.io/gpu-compute"}


def registered(node: Node) -> dict[str, api_pb2.RegisterRequest]:
    return {r.resource_name: r for r in node.kubelet.wait_registrations(3)}


def test_registers_every_resource_with_its_own_socket(node: Node, plugin: DevicePlugin) -> None:
    requests = registered(node)
    assert set(requests) == RESOURCES
    for request in requests.values():
        assert request.version == "v1beta1"
        assert (node.kubelet.folder / request.endpoint).is_socket()
        options = node.kubelet.plugin(request).GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        assert not options.pre_start_required
    assert len({r.endpoint for r in requests.values()}) == 3


def test_list_and_watch_streams_a_lost_gpu_as_unhealthy(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    requests = registered(node)
    gpus = [d.uuid for d in snapshot.devices]
    assert len(gpus) == 2 and all(isinstance(u, str) for u in gpus)
    stream = Watch(node.kubelet.plugin(requests["vgpu.io/gpu"]))
    first = stream.next()
    assert len(first.devices) == 2 * SHARES
    assert {d.health for d in first.devices} == {"Healthy"}
    memory_stream = Watch(node.kubelet.plugin(requests["vgpu.io/gpu-memory"]))
    memory = memory_stream.next()
    memory_stream.cancel()
    total = sum(d.memory_total for d in snapshot.devices if isinstance(d.memory_total, int))
    assert len(memory.devices) == total // GiB

    # GPU 1 stops answering: its UUID cannot be read any more.
    lost = dataclasses.replace(snapshot.devices[1], uuid=NOT_AVAILABLE)
    plugin.update_health(dataclasses.replace(snapshot, devices=(snapshot.devices[0], lost)))
    second = stream.next()
    health = {d.ID: d.health for d in second.devices}
    assert {h for i, h in health.items() if i.startswith(str(gpus[1]))} == {"Unhealthy"}
    assert {h for i, h in health.items() if i.startswith(str(gpus[0]))} == {"Healthy"}
    plugin.update_health(snapshot)  # back
    assert {d.health for d in stream.next().devices} == {"Healthy"}
    stream.cancel()


def test_a_hardware_xid_makes_a_gpu_unhealthy_and_an_application_xid_does_not(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    requests = registered(node)
    gpus = [str(d.uuid) for d in snapshot.devices]
    stream = Watch(node.kubelet.plugin(requests["vgpu.io/gpu-compute"]))
    assert {d.health for d in stream.next().devices} == {"Healthy"}

    def with_xids(*xids: tuple[int, int]) -> NodeSnapshot:
        hit = dataclasses.replace(snapshot.devices[0], xid_errors=xids)
        return dataclasses.replace(snapshot, devices=(hit, snapshot.devices[1]))

    # XID 13 (a program's own kernel fault): the GPU is fine, nothing is sent.
    plugin.update_health(with_xids((13, 2)))
    assert plugin.healthy == {gpus[0]: True, gpus[1]: True}
    # XID 48 (double-bit ECC error): the GPU is unhealthy on every resource.
    plugin.update_health(with_xids((13, 2), (48, 1)))
    health = {d.ID: d.health for d in stream.next().devices}
    assert {h for i, h in health.items() if i.startswith(gpus[0])} == {"Unhealthy"}
    assert {h for i, h in health.items() if i.startswith(gpus[1])} == {"Healthy"}
    stream.cancel()


def allocate(
    node: Node, request: api_pb2.RegisterRequest, ids: list[str]
) -> api_pb2.ContainerAllocateResponse:
    response = node.kubelet.plugin(request).Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        ),
        timeout=10,
    )
    assert len(response.container_responses) == 1
    answer: api_pb2.ContainerAllocateResponse = response.container_responses[0]
    return answer


LIMIT_VARIABLES = ("TENSOR_FUSION_CUDA_MEM_LIMIT", "TENSOR_FUSION_CUDA_UP_LIMIT")


def region_limits(node: Node, name: str) -> dict[str, tuple[int, float | None]]:
    """The pod's region's limits by GPU UUID (lower case): (memory bytes, compute percent)."""
    record = node.store.get("team", name)
    return {d.uuid.lower(): (d.memory_limit, d.compute_percent) for d in record.devices}


def test_allocate_leaves_the_limits_to_the_region_it_made(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """The pod source made the region first, from annotations lower than the resources: the
    region keeps them, and the container's env carries no limit (the region is the truth),
    only TF_REGION_REQUIRED, so that a process never makes a missing region of its own."""
    uuid = str(snapshot.devices[0].uuid)
    node.store.create("team", "lowered", {uuid: GpuLimits(memory=1 * GiB, compute=2000)})
    answers = admit(
        node, plugin, gpu_pod("lowered", 1, "2026-01-01T00:00:00Z", memory=4, compute=50)
    )
    envs = dict(answers["main"].envs)
    assert not set(LIMIT_VARIABLES) & set(envs)
    assert envs["TF_REGION_REQUIRED"] == "1"
    assert region_limits(node, "lowered") == {uuid.lower(): (1 * GiB, 20.0)}


def test_allocate_answers_with_a_folder_of_its_own_bound_to_the_pod_later(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """Allocate names no pod: the container mounts its allocation's folder as its pod folder,
    and the pod's region is linked into it once the kubelet lists the devices under the pod."""
    uuid = str(snapshot.devices[0].uuid)
    node.kubelet.connect()
    node.kubelet.pod_resources_down = True  # the binder cannot learn the pod yet
    trainer = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=30)
    node.pods.append(trainer)
    answer = node.kubelet.admit(kubelet_pod(trainer))["main"]
    envs = dict(answer.envs)
    assert not {"POD_NAME", "POD_NAMESPACE", "CONTAINER_NAME"} & set(envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert envs["SHM_PATH"] == "/run/tensor-fusion/shm/pod"
    assert envs["TF_REGION_WAIT"] == "60"
    assert not set(LIMIT_VARIABLES) & set(envs)
    assert envs["LD_PRELOAD"].split(":") == [
        "/usr/local/vgpu/lib/libadd_path.so",
        "/usr/local/vgpu/lib/libcuda_limiter.so",
    ]
    assert envs["TF_LD_PRELOAD"] == "/usr/local/vgpu/lib/libcuda_limiter.so"
    mounts = {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}
    base = node.layout.host_base
    folder = Path(mounts["/run/tensor-fusion/shm/pod"][0])
    assert folder.parent == base / ".allocations"
    assert mounts["/run/tensor-fusion/shm/pod"][1] is False
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (0, 0o755)
    assert mounts["/run/tensor-fusion/shm/.node"] == (str(base / ".node"), True)
    assert mounts["/usr/local/vgpu/lib/libcuda_limiter.so"][1] is True
    # Nothing else of the base path: no other pod's folder, not the base itself.
    writable = [path for path, (_, read_only) in mounts.items() if not read_only]
    assert writable == ["/run/tensor-fusion/shm/pod"]  # no lease file to truncate
    devices = {d.container_path: d.host_path for d in answer.devices}
    assert set(devices) == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia0",
    }
    assert allocation_of(plugin, answer).pod is None
    assert not (folder / "shm").exists()
    assert plugin.assigned("uid-trainer") == ()

    node.kubelet.pod_resources_down = False
    allocation = wait_bound(plugin, {"main": answer})["main"]
    assert (allocation.pod, allocation.uid, allocation.container) == (
        ("team", "trainer"),
        "uid-trainer",
        "main",
    )
    region = node.store.get("team", "trainer").path
    assert (folder / "shm").stat().st_ino == region.stat().st_ino
    assert region_limits(node, "trainer") == {uuid.lower(): (2 * GiB, 30.0)}
    assert plugin.assigned("uid-trainer") == (uuid,)


def test_allocate_gives_a_pod_asking_only_for_a_gpu_that_whole_gpu(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """Not no limit: the GPU's memory and all its time, as the pod source resolves it."""
    uuid, total = str(snapshot.devices[0].uuid), snapshot.devices[0].memory_total
    assert isinstance(total, int)
    admit(node, plugin, gpu_pod("whole", 1, "2026-01-01T00:00:00Z"))
    assert region_limits(node, "whole") == {uuid.lower(): (total, None)}  # 100 %: no limit


def test_allocate_holds_annotations_to_the_resources_on_the_gpus_given(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """Allocate resolves with the pod source's one resolver: annotations asking more than the
    resources, or naming another GPU than the one the kubelet gave, change nothing."""
    uuid = str(snapshot.devices[0].uuid)
    greedy = dataclasses.replace(
        gpu_pod("greedy", 1, "2026-01-01T00:00:00Z", memory=2, compute=10),
        annotations={
            "tensor-fusion.ai/vram-limit": "16Gi",
            "tensor-fusion.ai/compute-limit": "100",
            "tensor-fusion.ai/gpu-ids": "1",
        },
    )
    admit(node, plugin, greedy)
    assert region_limits(node, "greedy") == {uuid.lower(): (2 * GiB, 10.0)}


def test_an_unknown_device_is_an_error_naming_it(node: Node, plugin: DevicePlugin) -> None:
    request = registered(node)["vgpu.io/gpu"]
    with pytest.raises(grpc.RpcError) as unknown:
        allocate(node, request, ["GPU-nope-0"])
    assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unknown vgpu.io/gpu device(s) ['GPU-nope-0']" in str(unknown.value.details())


def test_every_resource_refuses_a_request_naming_no_device_or_an_unknown_one(
    node: Node, plugin: DevicePlugin
) -> None:
    """No device: INVALID_ARGUMENT (a GPU allocation made for it was never bound: no pod holds
    it); unknown devices: FAILED_PRECONDITION naming them, on the memory and compute resources
    too (they answered any). A good request is still answered."""
    requests = registered(node)
    kinds: dict[Kind, str] = {
        "gpu": "vgpu.io/gpu",
        "memory": "vgpu.io/gpu-memory",
        "compute": "vgpu.io/gpu-compute",
    }
    for kind, resource in kinds.items():
        with pytest.raises(grpc.RpcError) as empty:
            allocate(node, requests[resource], [])
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"container request 0 names no {resource} device" in str(empty.value.details())
        with pytest.raises(grpc.RpcError) as unknown:
            allocate(node, requests[resource], [plugin.ids[kind][0], "GPU-nope-7"])
        assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"unknown {resource} device(s) ['GPU-nope-7']" in str(unknown.value.details())
        allocate(node, requests[resource], [plugin.ids[kind][0]])
    assert len(plugin.bindings.all()) == 1  # the good GPU request's


def test_an_allocate_that_fails_leaves_no_allocation_behind(
    node: Node, plugin: DevicePlugin
) -> None:
    """A request whose second container names an unknown device, or one that fails after the
    first allocation was made (the limiter library is gone): no allocation or folder is left
    (the first container's stayed, for no pod ever to hold)."""
    gpu = registered(node)["vgpu.io/gpu"]
    stub = node.kubelet.plugin(gpu)
    known = plugin.ids["gpu"][0]

    def refused(*containers: list[str]) -> str:
        with pytest.raises(grpc.RpcError) as caught:
            stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers
                    ]
                ),
                timeout=10,
            )
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert plugin.bindings.all() == []
        assert not list(plugin.bindings.folder.glob("*"))
        return str(caught.value.details())

    assert "['GPU-nope-0']" in refused([known], ["GPU-nope-0"])
    (node.layout.host_lib_dir / "libcuda_limiter.so").unlink()
    assert "libcuda_limiter.so is missing" in refused([known])


def test_a_pod_the_pod_source_does_not_know_yet_is_bound_once_it_does(
    node: Node, plugin: DevicePlugin, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet lists the pod before the API server's watch brought it: the binder waits."""
    pod = gpu_pod("early", 1, "2026-01-01T00:00:00Z", memory=2)
    node.kubelet.connect()
    with caplog.at_level(logging.WARNING, "vgpu_hypervisor.device_plugin"):
        answer = node.kubelet.admit(kubelet_pod(pod))["main"]
        wait_for(lambda: "held by pod team/early, not known yet: not bound yet" in caplog.text)
    assert allocation_of(plugin, answer).pod is None
    node.pods.append(pod)
    assert wait_bound(plugin, {"main": answer})["main"].pod == ("team", "early")


def test_kubelet_restart_makes_the_plugin_register_again(node: Node, plugin: DevicePlugin) -> None:
    registered(node)
    node.kubelet.restart()  # the plugin's sockets are gone, kubelet.sock is a new file
    again = registered(node)
    assert set(again) == RESOURCES
    for request in again.values():
        stub = node.kubelet.plugin(request)
        assert not stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10).pre_start_required
    assert plugin.registered()


def container_environment(
    answer: api_pb2.ContainerAllocateResponse, sim_state: object
) -> dict[str, str]:
    """Exactly Allocate's env on the simulated GPU, container paths as the mounts map them."""
    mounts = sorted(((m.container_path, m.host_path) for m in answer.mounts), key=len, reverse=True)

    def on_host(value: str) -> str:
        for inside, host in mounts:
            value = value.replace(inside, host)
        return value

    environment = clean_environment() | sim.environment(state=str(sim_state))
    return environment | {name: on_host(value) for name, value in answer.envs.items()}


def run_workload(environment: dict[str, str], size: str) -> dict[str, object]:
    result = subprocess.run(
        [str(sim.workload_path()), "--kernels", "1", "--alloc", size],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report: dict[str, object] = json.loads(result.stdout)
    report["stderr"] = result.stderr
    return report


def test_a_workload_with_the_allocated_environment_is_limited(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot, sim_state: object
) -> None:
    pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=40)
    answers = admit(node, plugin, pod)
    environment = container_environment(answers["main"], sim_state)
    assert environment["LD_PRELOAD"].startswith(str(node.layout.host_lib_dir))

    fits = run_workload(environment, "1GiB")
    assert fits.get("error") is None, fits
    assert fits["total_bytes"] == 2 * GiB  # the region's limit, seen as the GPU's memory
    assert run_workload(environment, "3GiB")["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"


def test_a_limit_lifted_after_allocate_is_not_put_back_by_the_container(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot, sim_state: object
) -> None:
    """The region is the truth: the admin lifts the compute limit and raises the memory after
    Allocate, and a process the container starts later finds them so. (With the limits in the
    env, it seeded 40 % again into the region, where no limit reads as unset.)"""
    uuid = str(snapshot.devices[0].uuid)
    pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=40)
    answers = admit(node, plugin, pod)
    node.store.update("team", "trainer", {uuid: GpuLimits.change(memory=4 * GiB, compute=None)})
    report = run_workload(container_environment(answers["main"], sim_state), "3GiB")
    assert report.get("error") is None, report
    assert report["total_bytes"] == 4 * GiB
    assert "differs from the pod region" not in str(report["stderr"])
    assert region_limits(node, "trainer") == {uuid.lower(): (4 * GiB, None)}


def test_a_region_gone_after_binding_fails_the_containers_next_processes_closed(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot, sim_state: object
) -> None:
    """The region removed after the binding (an admin's delete): the binder unlinks it from
    the container's folder, so its next processes wait and then fail CUDA's initialization,
    making no region (which would hold no limit); the daemon's next region for the pod is
    linked again and is the one they use."""
    uuid = str(snapshot.devices[0].uuid)
    pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=40)
    answers = admit(node, plugin, pod)
    folder = plugin.bindings.path(allocation_of(plugin, answers["main"]).id)
    node.store.delete("team", "trainer")
    wait_for(lambda: not (folder / "shm").exists())
    environment = container_environment(answers["main"], sim_state) | {"TF_REGION_WAIT": "1"}

    refused = run_workload(environment, "1GiB")
    assert str(refused["error"]).startswith("CUDA_ERROR_NOT_INITIALIZED"), refused
    assert "no pod region after 1 s" in str(refused["stderr"])
    assert not (folder / "shm").exists()

    node.store.create("team", "trainer", {uuid: GpuLimits(memory=2 * GiB, compute=4000)})
    wait_for((folder / "shm").exists)
    assert run_workload(environment, "3GiB")["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"


def test_a_region_that_cannot_be_made_leaves_the_allocation_unbound_with_one_line(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot, caplog: pytest.LogCaptureFixture
) -> None:
    """No region, no link: the container's processes wait, then fail; the daemon says why."""
    (node.layout.host_base / "team").write_text("not a folder")
    pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2)
    node.pods.append(pod)
    node.kubelet.connect()
    with caplog.at_level(logging.WARNING, "vgpu_hypervisor.device_plugin"):
        answer = node.kubelet.admit(kubelet_pod(pod))["main"]
        line = wait_for(
            lambda: next(
                (r.getMessage() for r in caplog.records if "cannot bind" in r.getMessage()), None
            )
        )
    assert "pod team/trainer: cannot bind: cannot prepare its region:" in line
    assert "\n" not in line
    assert allocation_of(plugin, answer).pod is None
