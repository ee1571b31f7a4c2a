"""`tf-hypervisor daemon --dra`: the daemon publishes the node's ResourceSlice, serves the
kubelet's registration and DRA node service, prepares a claim into its pod's region and CDI
spec, and takes its sockets away when it stops."""

import shutil
from pathlib import Path

from vgpu_add_path import library_path as add_path_library
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_limiter import library_path as limiter_library

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
from tests.hypervisor.conftest import Daemon, wait_for
from tests.support.apiserver import ApiServer


def test_the_daemon_publishes_its_slice_and_prepares_a_claim(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(add_path_library(), lib / "libadd_path.so")
    shutil.copy(limiter_library(), lib / "libcuda_limiter.so")
    registry, plugins, cdi = tmp_path / "registry", tmp_path / "plugins", tmp_path / "cdi"
    (tmp_path / "node").mkdir()
    with ApiServer() as api:
        serve_namespace(api)
        daemon = Daemon(
            tmp_path / "node",
            extra=(
                "--dra",
                "--node-name", NODE,
                "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
                "--dra-registry-dir", str(registry),
                "--dra-plugins-dir", str(plugins),
                "--cdi-dir", str(cdi),
                "--device-plugin-lib-dir", str(lib),
            ),
        )  # fmt: skip
        daemon.start()
        try:
            wait_for(lambda: len(objects(api, SLICES)) == 1, timeout=30)
            (published,) = objects(api, SLICES)
            assert [d["name"] for d in published["spec"]["devices"]] == ["gpu-0", "gpu-1"]

            pod = put_pod(api, "p")
            consumed = {"memory": "3Gi", "compute": "25"}
            claim = put_claim(api, "c", pod, [{"device": "gpu-1", "consumedCapacity": consumed}])
            kubelet = DraKubelet(registry)
            wait_for(lambda: any(p.is_socket() for p in registry.iterdir()), timeout=30)
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
