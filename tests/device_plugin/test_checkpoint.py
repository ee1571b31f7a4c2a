"""A node reboot wipes the base path (a tmpfs): the allocations, their folders, the regions. The
kubelet's checkpoint (on disk) keeps each container's devices and Allocate answer, and the
kubelet restarts the pods from it without calling Allocate again: their containers mount the
old allocation folders. The daemon finds those allocations again in the checkpoint, when it
starts or when a folder it does not know appears, and binds them as before."""

import base64
import dataclasses
import json
import logging
import shutil
from pathlib import Path
from unittest.mock import ANY

import pytest
from vgpu_hypervisor.device_plugin.checkpoint import CheckpointError, Mounted, mounted_folders
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.gpu import NodeSnapshot

from tests.device_plugin.conftest import Node, admit, gpu_pod, serving
from tests.hypervisor.conftest import wait_for

LOGGER = "vgpu_hypervisor.device_plugin"


def mounted_folder(answer: api_pb2.ContainerAllocateResponse) -> Path:
    (folder,) = [m.host_path for m in answer.mounts if m.container_path.endswith("/shm/pod")]
    return Path(folder)


def reboot(node: Node) -> None:
    """The base path comes back empty; the kubelet keeps its checkpoint and its pods, now
    running again."""
    for child in node.layout.host_base.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    node.pods[:] = [dataclasses.replace(p, phase="Running") for p in node.pods]


def linked(node: Node, folder: Path, name: str) -> bool:
    """The folder holds the pod's region."""
    region = node.layout.host_base / "team" / name / "shm"
    try:
        return (folder / "shm").stat().st_ino == region.stat().st_ino
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("numa", [True, False], ids=["devices-by-numa", "devices-as-list"])
def test_a_pod_restarted_after_a_reboot_gets_its_region_again(
    node: Node, snapshot: NodeSnapshot, sim_state: object, numa: bool
) -> None:
    node.kubelet.numa = numa
    pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=30)
    with serving(node, snapshot) as plugin:
        answer = admit(node, plugin, pod)["main"]
        devices = plugin.bindings.get(mounted_folder(answer).name)
    folder = mounted_folder(answer)
    reboot(node)
    folder.mkdir(parents=True)  # the container runtime makes a missing mount source

    with serving(node, snapshot) as plugin:  # no Allocate: the kubelet restarts from its answer
        found = plugin.bindings.get(folder.name)
        assert found is not None and devices is not None
        assert found.devices == devices.devices
        wait_for(lambda: linked(node, folder, "trainer"), timeout=30)
        bound = plugin.bindings.get(folder.name)
        assert bound is not None and bound.pod == ("team", "trainer")
        assert folder.stat().st_mode & 0o777 == 0o755
    assert node.kubelet.lists > 0


def test_an_allocation_found_again_is_bound_only_to_the_pod_the_checkpoint_names(
    node: Node, snapshot: NodeSnapshot, sim_state: object, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod went while the node was down; one of its name (another UID) holds the devices
    now: the old folder is not given its region."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=30)
    with serving(node, snapshot) as plugin:
        folder = mounted_folder(admit(node, plugin, pod)["main"])
    reboot(node)
    node.pods[:] = [dataclasses.replace(p, uid="uid-another") for p in node.pods]

    with serving(node, snapshot) as plugin:
        found = plugin.bindings.get(folder.name)
        assert found is not None and found.uid == "uid-trainer"
        wait_for(lambda: any("not by pod uid-trainer" in r.getMessage() for r in caplog.records))
        plugin.bindings.bind_pass()
        assert not (folder / "shm").exists()
        assert plugin.bindings.get(folder.name) == dataclasses.replace(found, said=ANY)


def test_a_folder_the_binder_does_not_know_is_looked_up_in_the_checkpoint(
    node: Node, snapshot: NodeSnapshot, sim_state: object, caplog: pytest.LogCaptureFixture
) -> None:
    """The checkpoint cannot be read when the daemon starts (said once, nothing changes); a
    folder it does not know appears once it can: found there and bound."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=30)
    with serving(node, snapshot) as plugin:
        folder = mounted_folder(admit(node, plugin, pod)["main"])
    reboot(node)
    kept = node.kubelet.checkpoint.read_bytes()
    node.kubelet.checkpoint.unlink()
    caplog.clear()

    with serving(node, snapshot) as plugin:
        assert plugin.bindings.all() == []
        node.kubelet.checkpoint.write_bytes(kept)
        folder.mkdir(parents=True)
        wait_for(lambda: linked(node, folder, "trainer"), timeout=30)
    said = [r.getMessage() for r in caplog.records if "checkpoint is not used" in r.getMessage()]
    assert len(said) == 1, said


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"Data": {"PodDeviceEntries": {}}}',
        '{"Data": {"PodDeviceEntries": [3]}}',
        '{"Data": {"PodDeviceEntries": [{"ResourceName": "vgpu.io/gpu", "AllocResp": "!!"}]}}',
        '{"Data": {"PodDeviceEntries": [{"ResourceName": "vgpu.io/gpu", "AllocResp": "/w=="}]}}',
        '{"Data": {"PodDeviceEntries": [{"ResourceName": "vgpu.io/gpu", "DeviceIDs": [1]}]}}',
        '{"Data": {"PodDeviceEntries": [{"ResourceName": "vgpu.io/gpu", "PodUID": 1}]}}',
    ],
)
def test_a_malformed_checkpoint_is_an_error_of_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text(text)
    with pytest.raises(CheckpointError) as raised:
        mounted_folders(path, "vgpu.io/gpu", tmp_path / ".allocations")
    assert "\n" not in str(raised.value)


def test_only_the_gpu_resource_and_the_allocation_folders_are_read(tmp_path: Path) -> None:
    base = tmp_path / ".allocations"
    answer = api_pb2.ContainerAllocateResponse(
        mounts=[
            api_pb2.Mount(host_path=str(tmp_path / "lib" / "x.so"), container_path="/x.so"),
            api_pb2.Mount(host_path=str(base / "a1"), container_path="/run/shm/pod"),
        ]
    )
    encoded = base64.b64encode(answer.SerializeToString()).decode()
    entries = [
        {
            "PodUID": "p",
            "ResourceName": "vgpu.io/gpu",
            "DeviceIDs": {"0": ["g-1"], "1": ["g-0"]},
            "AllocResp": encoded,
        },
        {"ResourceName": "vgpu.io/gpu-memory", "DeviceIDs": ["m"], "AllocResp": "!!"},
        {"ResourceName": "vgpu.io/gpu", "DeviceIDs": None, "AllocResp": None},
    ]
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": entries}}))
    assert mounted_folders(path, "vgpu.io/gpu", base) == {"a1": Mounted("p", ("g-0", "g-1"))}


def test_a_malformed_checkpoint_changes_nothing(
    node: Node,
    snapshot: NodeSnapshot,
    sim_state: object,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Said once; the daemon serves on, Allocate and binding as usual, and a folder it does not
    know is left as it is while it runs."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    node.kubelet.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    node.kubelet.checkpoint.write_text('{"Data": {"PodDeviceEntries": "no"}}')
    stray = node.layout.host_base / ".allocations" / ("0" * 32)
    stray.mkdir(parents=True)
    with serving(node, snapshot) as plugin:
        stray.mkdir(parents=True, exist_ok=True)  # removed as unknown at start: made again
        pod = gpu_pod("trainer", 1, "2026-01-01T00:00:00Z", memory=2, compute=30)
        monkeypatch.setattr(node.kubelet, "write_checkpoint", lambda: None)  # kept malformed
        folder = mounted_folder(admit(node, plugin, pod)["main"])
        assert linked(node, folder, "trainer")
        plugin.bindings.bind_pass()
        assert stray.is_dir()
        assert plugin.bindings.get(stray.name) is None
    said = [r.getMessage() for r in caplog.records if "checkpoint is not used" in r.getMessage()]
    assert len(said) == 1, said
