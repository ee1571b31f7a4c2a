"""`tf-hypervisor daemon --device-plugin`: the daemon serves and registers the plugin, and with
the pod source (`--kubernetes`) answers Allocate once the pod's region is made."""

import shutil
from pathlib import Path

import grpc
import pytest
from vgpu_add_path import library_path as add_path_library
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_limiter import library_path as limiter_library

from tests.device_plugin.kubelet import Container, FakeKubelet, Pod, Watch
from tests.device_plugin.test_device_plugin import container_environment, run_workload
from tests.hypervisor.conftest import Daemon, wait_for
from tests.support.apiserver import ApiServer

GiB = 1 << 30
UUID0 = "GPU-5157a1e0-0000-4000-8000-000000000001"  # the simulated GPU 0


def test_the_daemon_registers_the_plugin_and_stops_it(tmp_path: Path) -> None:
    kubelet = FakeKubelet(tmp_path / "device-plugins")
    kubelet.start()
    daemon = Daemon(
        tmp_path / "node",
        extra=(
            "--device-plugin",
            "--device-plugin-dir",
            str(kubelet.folder),
            "--gpu-shares",
            "3",
        ),
    )
    (tmp_path / "node").mkdir()
    daemon.start()
    try:
        requests = {r.resource_name: r for r in kubelet.wait_registrations(3)}
        gpu = requests["vgpu.io/gpu"]
        stream = Watch(kubelet.plugin(gpu))
        assert len(stream.next().devices) == 2 * 3  # two simulated GPUs
        stream.cancel()
        # This branch's daemon has no pod source: Allocate says so instead of guessing.
        with pytest.raises(grpc.RpcError) as caught:
            kubelet.plugin(gpu).Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[])]
                ),
                timeout=10,
            )
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--kubernetes" in str(caught.value.details())
    finally:
        assert daemon.stop() == 0
        kubelet.stop()
    assert not list(kubelet.folder.glob("tf-hypervisor-*.sock"))
    log = daemon.log_file.read_text()
    assert "device plugin serving in" in log
    assert "registered vgpu.io/gpu, vgpu.io/gpu-memory, vgpu.io/gpu-compute" in log
    assert " failed" not in log  # sampling fed the plugin's health without an error


def _host_folder(answer: api_pb2.ContainerAllocateResponse) -> Path:
    (folder,) = [m.host_path for m in answer.mounts if m.container_path.endswith("/shm/pod")]
    return Path(folder)


def test_with_the_pod_source_each_allocation_is_bound_to_the_pod_the_kubelet_lists(
    tmp_path: Path,
) -> None:
    """The daemon as deployed: the pod source follows the API server, the device plugin serves
    the kubelet, the binder reads the kubelet's PodResources. Two pods of one shape are
    admitted, the younger first, with a daemon restart between them: each container's folder
    gets its own pod's region (the pod source made it, with the limits of the pod's resources
    and the owner of its security context); the env carries no limit, and a workload run with
    exactly that env is held to the region's limit."""
    api = ApiServer()
    api.up()
    kubelet = FakeKubelet(tmp_path / "device-plugins")
    kubelet.start()
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(add_path_library(), lib / "libadd_path.so")
    shutil.copy(limiter_library(), lib / "libcuda_limiter.so")
    (tmp_path / "node").mkdir()
    daemon = Daemon(
        tmp_path / "node",
        extra=(
            "--kubernetes",
            "--node-name", "node-a",
            "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
            "--device-plugin",
            "--device-plugin-dir", str(kubelet.folder),
            "--device-plugin-lib-dir", str(lib),
            "--pod-resources-socket", str(kubelet.pod_resources),
        ),
    )  # fmt: skip
    daemon.start()
    try:
        pods = {}
        for name, memory in (("older", "2"), ("younger", "3")):
            made = api.put_pod(
                name,
                resources={"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": memory},
                security={"runAsUser": 1000, "fsGroup": 2000},
                phase="Pending",
            )
            resources = {"vgpu.io/gpu": 1, "vgpu.io/gpu-memory": int(memory)}
            pods[name] = Pod(
                "default", name, made["metadata"]["uid"], (Container("main", resources),)
            )
        kubelet.connect()
        young = kubelet.admit(pods["younger"])["main"]
        wait_for((_host_folder(young) / "shm").exists, timeout=30)
        assert daemon.stop() == 0
        daemon.start()
        kubelet.connect()  # the restarted plugin's registrations
        old = kubelet.admit(pods["older"])["main"]
        wait_for((_host_folder(old) / "shm").exists, timeout=30)

        for answer, pod_name, size in ((young, "younger", 3), (old, "older", 2)):
            region = daemon.base / "default" / pod_name / "shm"
            assert (_host_folder(answer) / "shm").stat().st_ino == region.stat().st_ino
            assert (region.stat().st_uid, region.stat().st_gid) == (1000, 2000)
            pod = daemon.api("GET", f"/api/v1/pods/default/{pod_name}").json()
            (gpu0,) = [g for g in pod["gpus"] if g["index"] == 0]
            assert gpu0["memory_limit"] == size * GiB
        envs = dict(old.envs)
        assert envs["TF_REGION_REQUIRED"] == "1"
        assert not {k for k in envs if k.startswith("TENSOR_FUSION_CUDA_")}

        environment = container_environment(old, daemon.state)
        assert run_workload(environment, "1GiB").get("error") is None
        refused = run_workload(environment, "2GiB")
        assert refused["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", refused
    finally:
        assert daemon.stop() == 0
        kubelet.stop()
        api.down()
    log = daemon.log_file.read_text()
    assert "pod default/older: region created:" in log and "(owner 1000, group 2000)" in log
    assert ": pod default/older container main gets" in log
    assert "allocations: 1 kept, 1 of them bound" in log
