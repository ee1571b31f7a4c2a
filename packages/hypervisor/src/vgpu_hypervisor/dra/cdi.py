"""The CDI spec of a prepared claim: what the container runtime adds to the containers that use
it (Container Device Interface, github.com/cncf-tags/container-device-interface).

One spec file per claim, ``{cdi_dir}/gpu.vgpu.io-claim_{uid}.json``, kind ``gpu.vgpu.io/claim``:

- device ``{uid}``: the preload libraries (read-only), the pod's folder (its region) and the
  node's lease folder (read-only), NVIDIA's node-wide device files, and the environment the
  device plugin's Allocate gives (LD_PRELOAD, SHM_PATH, TF_REGION_REQUIRED, ...): no limit is in
  it, the region holds them;
- device ``{uid}-{device}`` (``device`` the slice's name of the GPU, ``gpu-{index}``): the
  GPU's own ``/dev/nvidiaN``.

Every device the claim was given names both, so a container asking for any of its requests
gets the limiter. The folder is the runtime's, root's: written through a descriptor of it, the
file never followed where it is a link, replaced whole by a rename.

The NVIDIA driver's user-space libraries (libcuda, libnvidia-ml, ...) and utilities come from
NVIDIA, one of two ways:

- NVIDIA's own CDI spec (kind ``nvidia.com/gpu``, written by ``nvidia-ctk cdi generate`` or
  NVIDIA's GPU operator) where the node has one naming each of the claim's GPUs (by UUID, else
  by index): the answer adds that device (``nvidia.com/gpu={uuid}``), so the runtime gives the
  container NVIDIA's libraries, device nodes and hooks exactly as NVIDIA's spec says, and this
  spec sets ``NVIDIA_VISIBLE_DEVICES=void`` so an NVIDIA runtime does not inject them again;
- otherwise the NVIDIA container runtime, as on the device plugin's path: this spec sets
  ``NVIDIA_VISIBLE_DEVICES`` to the claim's GPUs (replacing an image's ``all``) and mounts
  ``/dev/null`` at ``/var/run/nvidia-container-devices/{uuid}`` for each GPU (its volume-mounts
  device list), and the runtime injects the libraries of those GPUs.
"""

import contextlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from vgpu_hypervisor.device_plugin.allocation import (
    CONTROL_DEVICES,
    DEVICE_LIST,
    AllocationError,
    Layout,
    preload,
)
from vgpu_hypervisor.dra.claims import DRIVER, ClaimError

CDI_VERSION: Final = "0.6.0"
CLASS: Final = "claim"
KIND: Final = f"{DRIVER}/{CLASS}"
DEFAULT_FOLDER: Final = Path("/var/run/cdi")
NVIDIA_KIND: Final = "nvidia.com/gpu"
NVIDIA_FOLDERS: Final = (Path("/etc/cdi"), DEFAULT_FOLDER)  # the runtime's CDI folders
_FOLDER_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def spec_name(claim_uid: str) -> str:
    return f"{DRIVER}-{CLASS}_{claim_uid}.json"


def device_id(name: str) -> str:
    """The fully qualified CDI device name the kubelet passes to the runtime."""
    return f"{KIND}={name}"


@dataclass(frozen=True)
class SpecGpu:
    """One GPU of a claim: its device name in the slice, UUID, index, minor of /dev/nvidiaN
    (None when unknown)."""

    name: str
    uuid: str
    index: int
    minor: int | None


def nvidia_devices(folders: Iterable[Path]) -> frozenset[str]:
    """The device names in NVIDIA's CDI specs (kind nvidia.com/gpu, JSON or YAML) found in
    ``folders``; a file that cannot be read or parsed is passed over."""
    names: set[str] = set()
    for folder in folders:
        try:
            paths = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
        except OSError:
            continue
        for path in paths:
            try:
                spec = yaml.safe_load(path.read_text())  # JSON is YAML too
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            if isinstance(spec, dict) and spec.get("kind") == NVIDIA_KIND:
                devices = spec.get("devices") or []
                names.update(str(d["name"]) for d in devices if isinstance(d, dict) and "name" in d)
    return frozenset(names)


def _nvidia_name(gpu: SpecGpu, nvidia: frozenset[str]) -> str | None:
    for name in (gpu.uuid, str(gpu.index)):
        if name in nvidia:
            return name
    return None


def claim_spec(
    layout: Layout,
    claim_uid: str,
    namespace: str,
    pod: str,
    gpus: Sequence[SpecGpu],
    *,
    nvidia: frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The spec, and the CDI device IDs of each GPU (by device name); ``nvidia``: the devices
    of NVIDIA's CDI specs on the node (nvidia_devices)."""
    # Each GPU once: two requests of a claim may share one GPU, and CDI refuses a whole spec
    # that names a device twice ("invalid spec, multiple device"), so no container started.
    gpus = list({gpu.name: gpu for gpu in gpus}.values())
    folder = layout.container_base / namespace / pod
    try:
        environment, shared = preload(layout, folder)
    except AllocationError as error:
        raise ClaimError(str(error)) from None
    named = {gpu.name: _nvidia_name(gpu, nvidia) for gpu in gpus}
    by_nvidia = bool(gpus) and all(named.values())
    visible = "void" if by_nvidia else ",".join(sorted({gpu.uuid for gpu in gpus}))
    environment |= {"POD_NAME": pod, "POD_NAMESPACE": namespace, "NVIDIA_VISIBLE_DEVICES": visible}
    mounts = [
        *((host, at, read_only) for host, at, read_only in shared),
        (layout.host_base / namespace / pod, folder, False),
    ]
    common = {
        "name": claim_uid,
        "containerEdits": {
            "env": [f"{key}={value}" for key, value in environment.items()],
            "mounts": _mounts(mounts),
            "deviceNodes": _nodes(layout, CONTROL_DEVICES),
        },
    }
    devices: list[dict[str, Any]] = [common]
    ids: dict[str, list[str]] = {}
    for gpu in gpus:
        ids[gpu.name] = [device_id(claim_uid)]
        edits: dict[str, Any] = {}
        nodes = _nodes(layout, [f"nvidia{gpu.minor}"] if gpu.minor is not None else [])
        if nodes:
            edits["deviceNodes"] = nodes
        if not by_nvidia:  # the NVIDIA runtime's device list, as Allocate gives it
            edits["mounts"] = _mounts([(Path("/dev/null"), DEVICE_LIST / gpu.uuid, True)])
        if edits:  # CDI refuses a device that edits nothing
            own = f"{claim_uid}-{gpu.name}"
            devices.append({"name": own, "containerEdits": edits})
            ids[gpu.name].append(device_id(own))
        if by_nvidia:
            ids[gpu.name].append(f"{NVIDIA_KIND}={named[gpu.name]}")
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices}, ids


def _mounts(mounts: Iterable[tuple[Path, Path, bool]]) -> list[dict[str, Any]]:
    """CDI bind mounts of (host, container, read-only)."""
    return [
        {
            "hostPath": str(host),
            "containerPath": str(at),
            "options": ["ro" if read_only else "rw", "nosuid", "nodev", "bind"],
        }
        for host, at, read_only in mounts
    ]


def _nodes(layout: Layout, names: Sequence[str]) -> list[dict[str, str]]:
    """The device files of ``names`` the node has (a container's path is the host's)."""
    return [
        {"path": f"/dev/{name}", "hostPath": str(layout.dev_root / name), "permissions": "rw"}
        for name in names
        if (layout.dev_root / name).exists()
    ]


def write_spec(folder: Path, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    """The spec written whole (a new file renamed over the old); its path."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    name = spec_name(claim_uid)
    new = f".{name}.new"
    data = json.dumps(spec, indent=1).encode()
    directory = os.open(folder, _FOLDER_FLAGS)
    try:
        _unlink(new, directory)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(new, flags, 0o644, dir_fd=directory), "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.rename(new, name, src_dir_fd=directory, dst_dir_fd=directory)
    finally:
        os.close(directory)
    return folder / name


def remove_spec(folder: Path, claim_uid: str) -> None:
    """The claim's spec gone (nothing when there is none)."""
    try:
        directory = os.open(folder, _FOLDER_FLAGS)
    except FileNotFoundError:
        return
    try:
        _unlink(spec_name(claim_uid), directory)
    finally:
        os.close(directory)


def _unlink(name: str, directory: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory)
