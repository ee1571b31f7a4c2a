"""`tf-hypervisor daemon --device-plugin`: the daemon serves and registers the plugin."""

from pathlib import Path

import grpc
import pytest
from vgpu_hypervisor.device_plugin.proto import api_pb2

from tests.device_plugin.kubelet import FakeKubelet, Watch
from tests.hypervisor.conftest import Daemon


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
