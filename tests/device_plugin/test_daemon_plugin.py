"""`tf-hypervisor daemon --device-plugin`: the daemon serves and registers the plugin, and with
the pod source (`--kubernetes`) answers Allocate once the pod's region is made."""

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from vgpu_add_path import library_path as add_path_library
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_limiter import library_path as limiter_library

from tests.device_plugin.kubelet import DeviceManager, FakeKubelet, Watch
from tests.device_plugin.test_device_plugin import container_environment, run_workload
from tests.hypervisor.conftest import Daemon, wait_for
from tests.kubernetes.apiserver import ApiServer

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


@contextmanager
def cluster(tmp_path: Path, *flags: str) -> Iterator[tuple[ApiServer, FakeKubelet, Daemon]]:
    """The daemon as deployed, pod source and device plugin, with ``flags``, against the
    API-server stand-in and the kubelet stand-in; stopped cleanly after."""
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
            *flags,
        ),
    )  # fmt: skip
    daemon.start()
    try:
        yield api, kubelet, daemon
    finally:
        assert daemon.stop() == 0
        kubelet.stop()
        api.down()


def test_with_the_pod_source_allocate_answers_once_the_region_holds_the_pods_limits(
    tmp_path: Path,
) -> None:
    """The daemon as deployed: the pod source follows the API server, the device plugin serves
    the kubelet. When Allocate answers, the pod's region exists with the limits of its
    resources and the owner of its security context (the pod source made it, Allocate set it
    on the GPU the kubelet gave); the container's env carries no limit, and a workload run with
    exactly that env is held to the region's limit."""
    with cluster(tmp_path) as (api, kubelet, daemon):
        api.put_pod(
            "train",
            resources={"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "2", "vgpu.io/gpu-compute": "40"},
            security={"runAsUser": 1000, "fsGroup": 2000},
            phase="Pending",
        )
        requests = {r.resource_name: r for r in kubelet.wait_registrations(3)}
        gpu = kubelet.plugin(requests["vgpu.io/gpu"])

        def allocated() -> api_pb2.AllocateResponse | None:
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{UUID0}-0"])]
            )
            try:
                return gpu.Allocate(request, timeout=10)
            except grpc.RpcError as error:  # the pod source has not listed the pod yet
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
                return None

        (answer,) = wait_for(allocated, timeout=15).container_responses
        region = daemon.base / "default" / "train" / "shm"
        assert (region.stat().st_uid, region.stat().st_gid) == (1000, 2000)
        pod = daemon.api("GET", "/api/v1/pods/default/train").json()
        (gpu0,) = [g for g in pod["gpus"] if g["index"] == 0]
        assert (gpu0["memory_limit"], gpu0["compute_limit"]) == (2 * GiB, 40.0)
        envs = dict(answer.envs)
        assert envs["TF_REGION_REQUIRED"] == "1"
        assert not {k for k in envs if k.startswith("TENSOR_FUSION_CUDA_")}

        environment = container_environment(answer, daemon.state)
        assert run_workload(environment, "1GiB").get("error") is None
        refused = run_workload(environment, "2GiB")
        assert refused["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", refused
    log = daemon.log_file.read_text()
    assert "pod default/train: region created:" in log and "(owner 1000, group 2000)" in log
    assert "Allocate: pod default/train container main gets" in log


def test_a_gpu_only_pod_is_charged_the_default_and_a_gpu_that_cannot_hold_a_pod_refuses_it(
    tmp_path: Path,
) -> None:
    """With default limits set, a pod asking only for vgpu.io/gpu gets them in its region and
    is charged them on its GPU (the API and `tf-hypervisor gpus` say so); the kubelet giving
    a later pod a share of that GPU, which cannot hold it, gets Allocate refused, and the pod
    an event that says why."""
    flags = ("--default-gpu-memory", "8GiB", "--default-gpu-compute", "25")
    with cluster(tmp_path, *flags) as (api, kubelet, daemon):
        api.put_pod("plain", resources={"vgpu.io/gpu": "1"}, phase="Pending")
        requests = {r.resource_name: r for r in kubelet.wait_registrations(3)}
        manager = DeviceManager(kubelet, requests["vgpu.io/gpu"])

        def admitted() -> list[str] | None:
            try:
                return manager.admit(1)[0]
            except grpc.RpcError as error:  # the pod source has not listed the pod yet
                assert "no pending pod" in str(error.details()), error
                return None

        (share,) = wait_for(admitted, timeout=15)
        uuid = share.rsplit("-", 1)[0]
        pod = daemon.api("GET", "/api/v1/pods/default/plain").json()
        (gpu,) = [g for g in pod["gpus"] if g["uuid"].lower() == uuid.lower()]
        assert (gpu["memory_limit"], gpu["compute_limit"]) == (8 * GiB, 25.0)

        def committed() -> dict[str, tuple[int, float]]:
            gpus = daemon.api("GET", "/api/v1/gpus").json()
            return {g["uuid"]: (g["memory_committed"], g["compute_committed"]) for g in gpus}

        wait_for(lambda: committed()[uuid] == (8 * GiB, 25.0), timeout=15)
        assert sorted(committed().values()) == [(0, 0.0), (8 * GiB, 25.0)]
        shown = daemon.cli("gpus")
        assert shown.returncode == 0, shown.stderr
        assert "Committed" in shown.stdout and "25%" in shown.stdout, shown.stdout

        api.put_pod(
            "late",
            resources={"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "76", "vgpu.io/gpu-compute": "10"},
            phase="Pending",
        )
        other = next(one for one in sorted(manager.free()) if one.startswith(uuid))

        def refused() -> str | None:
            try:
                manager.allocate([other])
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
                details = str(error.details())
                return details if "cannot hold it" in details else None
            raise AssertionError("a GPU that cannot hold the pod was given it")

        why = wait_for(refused, timeout=15)
        assert why.startswith(f"pod default/late: GPU {uuid} cannot hold it: it asks 76 GiB")
        events = wait_for(
            lambda: [e for e in list(api.events) if e["reason"] == "GpuDoesNotFit"], timeout=15
        )
        assert events[0]["involvedObject"]["name"] == "late" and events[0]["message"] == why
    assert "pod default/late: GPU " in daemon.log_file.read_text()
