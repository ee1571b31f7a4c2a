"""The kubelet's device-manager checkpoint, read to find the allocations a reboot wiped.

The base path is a tmpfs: a reboot wipes the allocations, their folders and the regions. The
kubelet keeps, on disk, ``kubelet_internal_checkpoint`` in its device-plugin folder: per pod,
container and resource the devices it gave and the Allocate answer (the serialized
``ContainerAllocateResponse``, base64 in the JSON). It restarts a pod's containers from that
answer without calling Allocate again, so they mount the old allocation folders. Format
(pkg/kubelet/cm/devicemanager/checkpoint): ``{"Data": {"PodDeviceEntries": [{"PodUID",
"ContainerName", "ResourceName", "DeviceIDs", "AllocResp"}], "RegisteredDevices": {...}},
"Checksum": ...}``; ``DeviceIDs`` maps a NUMA node to IDs (a plain list before Kubernetes 1.20).
"""

import base64
import binascii
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

from google.protobuf.message import DecodeError

from vgpu_hypervisor.device_plugin.proto import api_pb2

FILE: Final = "kubelet_internal_checkpoint"  # in the kubelet's device-plugin folder


class CheckpointError(Exception):
    """The checkpoint is missing, unreadable or not in the kubelet's format; one line."""


class Mounted(NamedTuple):
    pod_uid: str  # the pod the kubelet gave the devices to
    devices: tuple[str, ...]


def mounted_folders(path: Path, resource: str, folder: Path) -> dict[str, Mounted]:
    """By name, each folder directly under ``folder`` that an Allocate answer of ``resource``
    kept in the checkpoint at ``path`` mounts from the host. CheckpointError when the file
    cannot be read or any entry of ``resource`` is malformed."""
    try:
        document = json.loads(path.read_bytes())
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read: {error.strerror or error}") from None
    except ValueError as error:
        raise CheckpointError(f"{path}: not JSON: {error}") from None
    data = document.get("Data") if isinstance(document, dict) else None
    entries = data.get("PodDeviceEntries") if isinstance(data, dict) else None
    if not isinstance(entries, list | None):
        raise CheckpointError(f"{path}: no PodDeviceEntries list")
    found: dict[str, Mounted] = {}
    for index, entry in enumerate(entries or []):
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path}: entry {index} is not an object")
        if entry.get("ResourceName") != resource:
            continue
        uid = entry.get("PodUID", "")
        if not isinstance(uid, str):
            raise CheckpointError(f"{path}: entry {index}: PodUID is not text")
        try:
            devices = _devices(entry.get("DeviceIDs"))
            answer = _answer(entry.get("AllocResp"))
        except (ValueError, TypeError, DecodeError) as error:
            raise CheckpointError(f"{path}: entry {index}: {error}") from None
        for mount in answer.mounts:
            host = Path(mount.host_path)
            if host.parent == folder and host.name:
                found[host.name] = Mounted(uid, tuple(sorted(devices)))
    return found


def _devices(value: Any) -> set[str]:
    """The IDs of ``DeviceIDs``: by NUMA node, or a plain list (older kubelets)."""
    groups = value.values() if isinstance(value, Mapping) else [value]
    ids: set[str] = set()
    for group in groups:
        if group is None:
            continue
        if not isinstance(group, list) or not all(isinstance(one, str) for one in group):
            raise ValueError("DeviceIDs is not lists of strings")
        ids.update(group)
    return ids


def _answer(value: Any) -> api_pb2.ContainerAllocateResponse:
    if value is None:
        return api_pb2.ContainerAllocateResponse()
    if not isinstance(value, str):
        raise TypeError("AllocResp is not base64 text")
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error as error:
        raise ValueError(f"AllocResp is not base64: {error}") from None
    return api_pb2.ContainerAllocateResponse.FromString(raw)
