"""`tf-hypervisor daemon --device-plugin`: the daemon serves and registers the plugin, and with
the pod source (`--kubernetes`) answers Allocate once the pod's region is made."""

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
GPU = "vgpu.io/gpu"
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
            "--pod-resources-socket", str(kubelet.pod_resources),
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


def _wait_linked(daemon: Daemon, answer: api_pb2.ContainerAllocateResponse) -> None:
    """Until the allocation's folder holds its pod's region; past 30 s, the daemon's log says
    why not."""
    try:
        wait_for((_host_folder(answer) / "shm").exists, timeout=30)
    except AssertionError as error:
        log = daemon.log_file.read_text(errors="replace") if daemon.log_file.exists() else ""
        message = f"no region linked in 30 s; the daemon's log ends:\n{log[-3000:]}"
        raise AssertionError(message) from error


def test_with_the_pod_source_each_allocation_is_bound_to_the_pod_the_kubelet_lists(
    tmp_path: Path,
) -> None:
    """The daemon as deployed: the pod source follows the API server, the device plugin serves
    the kubelet, the binder reads the kubelet's PodResources. Two pods of one shape are
    admitted, the younger first, with a daemon restart between them: each container's folder
    gets its own pod's region (the pod source made it, with the limits of the pod's resources
    and the owner of its security context); the env carries no limit, and a workload run with
    exactly that env is held to the region's limit."""
    with cluster(tmp_path) as (api, kubelet, daemon):
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
        _wait_linked(daemon, young)
        assert daemon.stop() == 0
        daemon.start()
        kubelet.connect()  # the restarted plugin's registrations
        old = kubelet.admit(pods["older"])["main"]
        _wait_linked(daemon, old)

        for answer, pod_name, size in ((young, "younger", 3), (old, "older", 2)):
            region = daemon.base / "default" / pod_name / "shm"
            assert (_host_folder(answer) / "shm").stat().st_ino == region.stat().st_ino
            assert (region.stat().st_uid, region.stat().st_gid) == (1000, 2000)
            pod = daemon.api("GET", f"/api/v1/pods/default/{pod_name}").json()
            (share,) = kubelet.admitted[pods[pod_name].uid].devices["main"][GPU]
            # Its region holds the GPU the kubelet gave it, and only that one.
            (gpu,) = pod["gpus"]
            assert gpu["uuid"].lower() == share.rsplit("-", 1)[0].lower()
            assert gpu["memory_limit"] == size * GiB
        envs = dict(old.envs)
        assert envs["TF_REGION_REQUIRED"] == "1"
        assert not {k for k in envs if k.startswith("TENSOR_FUSION_CUDA_")}

        environment = container_environment(old, daemon.state)
        assert run_workload(environment, "1GiB").get("error") is None
        refused = run_workload(environment, "2GiB")
        assert refused["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", refused
    log = daemon.log_file.read_text()
    assert "pod default/older: region created:" in log and "(owner 1000, group 2000)" in log
    assert ": pod default/older container main gets" in log
    assert "allocations: 1 kept, 1 of them bound" in log


def test_a_gpu_only_pod_is_charged_the_default_and_a_gpu_that_cannot_hold_a_pod_refuses_it(
    tmp_path: Path,
) -> None:
    """With default limits set, a pod asking only for vgpu.io/gpu gets them in its region and
    is charged them on its GPU once bound (the API and `tf-hypervisor gpus` say so); a later
    pod the kubelet gives a share of that GPU, which cannot hold it, is refused at binding:
    no region is linked into its container's folder, and the pod gets an event that says
    why."""
    flags = ("--default-gpu-memory", "8GiB", "--default-gpu-compute", "25")
    with cluster(tmp_path, *flags) as (api, kubelet, daemon):
        made = api.put_pod("plain", resources={"vgpu.io/gpu": "1"}, phase="Pending")
        plain = Pod("default", "plain", made["metadata"]["uid"], (Container("main", {GPU: 1}),))
        kubelet.connect()
        answer = kubelet.admit(plain)["main"]
        wait_for((_host_folder(answer) / "shm").exists, timeout=30)
        (share,) = kubelet.admitted[plain.uid].devices["main"][GPU]
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

        asks = {GPU: "1", "vgpu.io/gpu-memory": "76", "vgpu.io/gpu-compute": "10"}
        made = api.put_pod("late", resources=asks, phase="Pending")
        counts = {name: int(count) for name, count in asks.items()}
        late = Pod("default", "late", made["metadata"]["uid"], (Container("main", counts),))
        other = next(d for d in kubelet.devices[GPU] if d.startswith(uuid) and d != share)
        refused = kubelet.admit(late, {("main", GPU): [other]})["main"]
        events = wait_for(
            lambda: [e for e in list(api.events) if e["reason"] == "GpuDoesNotFit"], timeout=30
        )
        (event,) = events
        assert event["involvedObject"]["name"] == "late" and event["type"] == "Warning"
        why = event["message"]
        assert why.startswith(f"pod default/late: GPU {uuid} cannot hold it: it asks 76 GiB")
        time.sleep(1)  # the binder's next passes
        assert not (_host_folder(refused) / "shm").exists()  # its container sees no region
    log = daemon.log_file.read_text()
    assert log.count("refused, no region linked: pod default/late: GPU ") == 1
