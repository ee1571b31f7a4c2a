"""`tf-hypervisor daemon --dra`: the daemon publishes the node's ResourceSlice, serves the
kubelet's registration and DRA node service, prepares a claim into its pod's region and CDI
spec, and takes its sockets away when it stops; its GPU sampling takes a GPU that falls off the
bus out of the slice, so a claim that can only have that GPU waits until it is back."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vgpu_add_path import library_path as add_path_library
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_limiter import library_path as limiter_library

from tests.dra.allocator import Scheduler, Unschedulable
from tests.dra.conftest import (
    NAMESPACE,
    NODE,
    SLICES,
    GiB,
    objects,
    put_claim,
    put_pod,
    serve_namespace,
)
from tests.dra.kubelet import DraKubelet
from tests.dra.test_scenarios import Users, gpu_request, placed
from tests.hypervisor.conftest import Daemon, wait_for
from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import POD

TF_LIMITER = str(Path(sys.executable).with_name("tf-limiter"))


def dra_daemon(root: Path, api: ApiServer) -> Daemon:
    """A daemon (not started) of a simulated node of two GPUs, with --dra: its libraries, the
    kubelet's folders (registry, plugins) and the CDI folder under ``root``."""
    lib = root / "lib"
    lib.mkdir()
    shutil.copy(add_path_library(), lib / "libadd_path.so")
    shutil.copy(limiter_library(), lib / "libcuda_limiter.so")
    (root / "node").mkdir()
    return Daemon(
        root / "node",
        extra=(
            "--dra",
            "--node-name", NODE,
            "--kubeconfig", str(api.kubeconfig(root / "kubeconfig")),
            "--dra-registry-dir", str(root / "registry"),
            "--dra-plugins-dir", str(root / "plugins"),
            "--cdi-dir", str(root / "cdi"),
            "--device-plugin-lib-dir", str(lib),
        ),
    )  # fmt: skip


def published(api: ApiServer, *, tainted: bool = False) -> list[str]:
    """The devices of the node's one ResourceSlice, untainted (or ``tainted``)."""
    (found,) = objects(api, SLICES)
    return [d["name"] for d in found["spec"]["devices"] if bool(d.get("taints")) == tainted]


def test_the_daemon_publishes_its_slice_and_prepares_a_claim(tmp_path: Path) -> None:
    registry, cdi = tmp_path / "registry", tmp_path / "cdi"
    with ApiServer() as api:
        serve_namespace(api)
        daemon = dra_daemon(tmp_path, api)
        daemon.start()
        try:
            wait_for(lambda: len(objects(api, SLICES)) == 1, timeout=30)
            assert published(api) == ["gpu-0", "gpu-1"]

            pod = put_pod(api, "p")
            consumed = {"memory": "3Gi", "compute": "25"}
            claim = put_claim(api, "c", pod, [{"device": "gpu-1", "consumedCapacity": consumed}])
            kubelet = DraKubelet(registry)
            plugin = kubelet.register()
            uid = claim["metadata"]["uid"]
            answer = plugin.prepare((NAMESPACE, "c", uid)).claims[uid]
            assert answer.error == "", answer.error
            assert (cdi / f"gpu.vgpu.io-claim_{uid}.json").is_file()
            store_view = PodStore(tmp_path / "node" / "shm")
            record = store_view.get(NAMESPACE, "p")
            assert [d.limits.value for d in record.devices] == [
                GpuLimits(memory=3 * GiB, compute=2500)
            ]
            store_view.close()
            assert plugin.unprepare((NAMESPACE, "c", uid)).claims[uid].error == ""
            kubelet.close()
        finally:
            assert daemon.stop() == 0
    assert not any(p.is_socket() for p in registry.iterdir())
    log = daemon.log_file.read_text()
    assert "DRA driver serving in" in log
    assert "registered with the kubelet as gpu.vgpu.io" in log
    assert " failed" not in log


def test_a_slice_wiped_by_a_restarting_kubelet_is_published_again(tmp_path: Path) -> None:
    """A kubelet wipes every ResourceSlice of its node when it starts. Before, the daemon wrote
    its slice only when the GPUs' health changed: it stayed gone, and the node's GPUs took no
    claim until the daemon restarted. It is looked for every 10 s, and written again."""
    with ApiServer() as api:
        serve_namespace(api)
        daemon = dra_daemon(tmp_path, api)
        daemon.start()
        try:
            wait_for(lambda: len(objects(api, SLICES)) == 1, timeout=30)
            kubelet = DraKubelet(tmp_path / "registry")
            kubelet.register()
            kubelet.restart()
            (name,) = [one["metadata"]["name"] for one in objects(api, SLICES)]
            api.store.delete(SLICES, None, name)
            kubelet.register()
            wait_for(lambda: len(objects(api, SLICES)) == 1, timeout=30)
            assert published(api) == ["gpu-0", "gpu-1"]
            kubelet.close()
        finally:
            assert daemon.stop() == 0
    assert "gone (a kubelet restarted?): written again" in daemon.log_file.read_text()


def lose_gpu(daemon: Daemon, index: int, *options: str) -> None:
    """The simulated GPU ``index`` of the daemon's node falls off the bus (or is back)."""
    command = [TF_LIMITER, "sim", "lose-gpu", str(index), "--state", str(daemon.state), *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("taints", [False, True], ids=["left-out", "tainted"])
def test_a_gpu_that_falls_off_the_bus_leaves_the_slice_and_a_claim_for_it_waits(
    tmp_path: Path, taints: bool
) -> None:
    """Where the API server keeps device taints (DRADeviceTaints), the GPU stays in the slice,
    tainted; elsewhere it leaves the slice. Either way no new claim is placed on it."""
    with ApiServer(feature_gates={"DRADeviceTaints": taints}) as api:
        serve_namespace(api)
        users = Users(api)
        users.install()
        scheduler = Scheduler(api)
        daemon = dra_daemon(tmp_path, api)
        daemon.start()
        kubelet = DraKubelet(tmp_path / "registry")
        try:
            wait_for(lambda: objects(api, SLICES) and published(api) == ["gpu-0", "gpu-1"], 30)
            (found,) = objects(api, SLICES)
            broken = found["spec"]["devices"][1]["attributes"]["uuid"]["string"]

            lose_gpu(daemon, 1)  # the daemon's next sample cannot read it
            wait_for(lambda: published(api) == ["gpu-0"], timeout=30)
            assert published(api, tainted=True) == (["gpu-1"] if taints else [])

            selector = f'device.attributes["gpu.vgpu.io"].uuid == "{broken}"'
            request = gpu_request(memory="1Gi")
            request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
            users.template("that-gpu", [request])
            users.pod("stuck", "that-gpu")
            with pytest.raises(Unschedulable, match="cannot allocate all claims"):
                scheduler.schedule(NAMESPACE, "stuck")
            pod = api.store.get(POD, NAMESPACE, "stuck")
            (condition,) = pod["status"]["conditions"]
            assert (condition["type"], condition["status"], condition["reason"]) == (
                "PodScheduled", "False", "Unschedulable"
            )  # fmt: skip
            assert not pod["spec"].get("nodeName")
            (claim,) = users.claims_of("stuck")
            assert "allocation" not in claim.get("status", {})

            users.template("any-gpu", [gpu_request(memory="1Gi")])
            users.pod("fine", "any-gpu")  # one not bound to that GPU lands on the healthy one
            assert scheduler.schedule(NAMESPACE, "fine") == NODE
            (claim,) = users.claims_of("fine")
            assert [device for device, _ in placed(claim)] == ["gpu-0"]
            uid = claim["metadata"]["uid"]
            answer = kubelet.register().prepare((NAMESPACE, claim["metadata"]["name"], uid))
            assert answer.claims[uid].error == ""

            lose_gpu(daemon, 1, "--back")  # readable again: published again
            wait_for(lambda: published(api) == ["gpu-0", "gpu-1"], timeout=30)
            assert scheduler.schedule(NAMESPACE, "stuck") == NODE
            (claim,) = users.claims_of("stuck")
            assert [device for device, _ in placed(claim)] == ["gpu-1"]
        finally:
            kubelet.close()
            assert daemon.stop() == 0
    log = daemon.log_file.read_text()
    how = "tainted" if taints else "left out"
    assert f"ResourceSlice: unhealthy GPU(s) {how}: {broken}" in log
    assert "ResourceSlice: every GPU published (2)" in log


def test_the_pod_source_leaves_a_dra_pods_region_to_its_claim(tmp_path: Path) -> None:
    # --dra with --kubernetes, as deployed: a pod whose GPUs come from a claim but which also
    # carries tensor-fusion.ai annotations keeps its claim's quota, on its claim's GPU alone;
    # the annotations (an annotations-only pod's whole GPU on every GPU) raise nothing.
    with ApiServer() as api:
        serve_namespace(api)
        daemon = dra_daemon(tmp_path, api)
        daemon.extra = (*daemon.extra, "--kubernetes")
        daemon.start()
        try:
            wait_for(lambda: len(objects(api, SLICES)) == 1, timeout=30)
            pod = api.store.put(POD, NAMESPACE, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": NAMESPACE,
                             "annotations": {"tensor-fusion.ai/vram-limit": "70Gi",
                                             "tensor-fusion.ai/qos": "high"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda"}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
            })  # fmt: skip
            consumed = {"memory": "3Gi", "compute": "25"}
            claim = put_claim(api, "c", pod, [{"device": "gpu-1", "consumedCapacity": consumed}])
            kubelet = DraKubelet(tmp_path / "registry")
            plugin = kubelet.register()
            uid = claim["metadata"]["uid"]
            assert plugin.prepare((NAMESPACE, "c", uid)).claims[uid].error == ""
            pod["status"] = {"phase": "Running"}  # the kubelet starts it: the pod source hears
            api.store.put(POD, NAMESPACE, pod)
            # An annotations-only pod after it: its region made, the event before it is handled.
            api.store.put(POD, NAMESPACE, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "after", "namespace": NAMESPACE,
                             "annotations": {"tensor-fusion.ai/vram-limit": "1Gi"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda"}]},
            })  # fmt: skip
            view = PodStore(tmp_path / "node" / "shm")
            wait_for((tmp_path / "node" / "shm" / NAMESPACE / "after").exists, 30)
            record = view.get(NAMESPACE, "p")
            assert [d.limits.value for d in record.devices] == [
                GpuLimits(memory=3 * GiB, compute=2500)
            ]
            view.close()
            kubelet.close()
        finally:
            assert daemon.stop() == 0
    log = daemon.log_file.read_text()
    assert "its GPUs come from DRA claims: tensor-fusion.ai/* annotations ignored" in log
    assert "not through the API" not in log
