"""The device nodes Allocate gives a container: what CUDA needs, whether or not the daemon's
own container sees them (with NVIDIA_DRIVER_CAPABILITIES=utility it has no /dev/nvidia-uvm)."""

from pathlib import Path

import pytest
from vgpu_hypervisor.device_plugin.allocation import (
    AllocationError,
    Layout,
    container_response,
)

GPU_A = "GPU-00000000-0000-0000-0000-00000000000a"
GPU_B = "GPU-00000000-0000-0000-0000-00000000000b"


def _layout(tmp_path: Path, seen: tuple[str, ...]) -> Layout:
    lib = tmp_path / "lib"
    lib.mkdir()
    for library in ("libadd_path.so", "libcuda_limiter.so"):
        (lib / library).touch()
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in seen:
        (dev / name).touch()
    return Layout(host_lib_dir=lib, host_base=tmp_path / "shm", dev_root=dev)


def _devices(layout: Layout, ids: list[str], minors: dict[str, int]) -> dict[str, str]:
    answer = container_response(
        layout,
        device_ids=ids,
        host_folder=layout.host_base / ".allocations" / "a1",
        minors=minors,
        region_wait_s=60,
    )
    assert all(d.permissions == "rw" for d in answer.devices)
    return {d.container_path: d.host_path for d in answer.devices}


def test_cuda_nodes_are_passed_though_the_daemon_sees_none(tmp_path: Path) -> None:
    layout = _layout(tmp_path, seen=())
    devices = _devices(layout, [f"{GPU_B}-0", f"{GPU_B}-1"], {GPU_A: 0, GPU_B: 3})
    dev = layout.dev_root
    assert devices == {
        "/dev/nvidiactl": str(dev / "nvidiactl"),
        "/dev/nvidia-uvm": str(dev / "nvidia-uvm"),
        "/dev/nvidia-uvm-tools": str(dev / "nvidia-uvm-tools"),
        "/dev/nvidia3": str(dev / "nvidia3"),  # GPU B's minor number; not GPU A's
    }


def test_modeset_only_where_the_daemon_sees_it(tmp_path: Path) -> None:
    layout = _layout(tmp_path, seen=("nvidia-modeset",))
    devices = _devices(layout, [f"{GPU_A}-0", f"{GPU_B}-0"], {GPU_A: 0, GPU_B: 1})
    assert {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-modeset"} <= set(devices)


def test_a_gpu_without_a_minor_number_is_refused(tmp_path: Path) -> None:
    layout = _layout(tmp_path, seen=())
    with pytest.raises(AllocationError, match=f"GPU {GPU_B}: NVML gave no minor number"):
        _devices(layout, [f"{GPU_B}-0"], {GPU_A: 0})


def test_the_gpus_are_also_a_list_of_mounts_for_the_container_runtime(tmp_path: Path) -> None:
    layout = _layout(tmp_path, seen=())
    answer = container_response(
        layout,
        device_ids=[f"{GPU_B}-0"],
        host_folder=layout.host_base / ".allocations" / "a1",
        minors={GPU_A: 0, GPU_B: 1},
        region_wait_s=60,
    )
    listed = {
        m.container_path: (m.host_path, m.read_only)
        for m in answer.mounts
        if m.container_path.startswith("/var/run/nvidia-container-devices/")
    }
    assert listed == {f"/var/run/nvidia-container-devices/{GPU_B}": ("/dev/null", True)}
    assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == GPU_B


def test_a_gpu_given_for_a_share_nobody_asks_gets_no_region_without_limits(
    tmp_path: Path,
) -> None:
    """Before, a GPU the kubelet gave a pod whose containers ask for no vgpu share the daemon
    can read (a GPU sidecar, as the pod source once read pods) got a region without limits."""
    from vgpu_hypervisor.device_plugin.allocation import pod_region

    from tests.kubernetes.test_annotations import pod

    layout = _layout(tmp_path, ())
    with pytest.raises(AllocationError, match=f"holds GPU {GPU_A} but asks for no vgpu.io/gpu"):
        pod_region(pod({}, {"cpu": "1"}), layout, [GPU_A])
    limits, _ = pod_region(pod({}, {"vgpu.io/gpu": "1"}), layout, [GPU_A])
    assert list(limits) == [GPU_A]
