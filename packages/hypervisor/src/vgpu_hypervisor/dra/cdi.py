"""The CDI spec of a prepared claim: what the container runtime adds to the containers that use
it (Container Device Interface, github.com/cncf-tags/container-device-interface).

One spec file per claim, ``{cdi_dir}/gpu.vgpu.io-claim_{uid}.json``, kind ``gpu.vgpu.io/claim``:

- device ``{uid}``: the preload libraries (read-only), the pod's folder (its region) and the
  node's lease folder (read-only), NVIDIA's node-wide device files, and the environment the
  device plugin's Allocate gives (LD_PRELOAD, SHM_PATH, TF_REGION_REQUIRED, ...): no limit is in
  it, the region holds them;
- device ``{uid}-gpu-{index}``: the GPU's own ``/dev/nvidiaN``.

Every device the claim was given names both, so a container asking for any of its requests
gets the limiter. The folder is the runtime's, root's: written through a descriptor of it, the
file never followed where it is a link, replaced whole by a rename.
"""

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from vgpu_hypervisor.device_plugin.allocation import (
    CONTROL_DEVICES,
    AllocationError,
    Layout,
    preload,
)
from vgpu_hypervisor.dra.claims import DRIVER, ClaimError

CDI_VERSION: Final = "0.6.0"
CLASS: Final = "claim"
KIND: Final = f"{DRIVER}/{CLASS}"
DEFAULT_FOLDER: Final = Path("/var/run/cdi")
_FOLDER_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def spec_name(claim_uid: str) -> str:
    return f"{DRIVER}-{CLASS}_{claim_uid}.json"


def device_id(name: str) -> str:
    """The fully qualified CDI device name the kubelet passes to the runtime."""
    return f"{KIND}={name}"


def claim_spec(
    layout: Layout,
    claim_uid: str,
    namespace: str,
    pod: str,
    gpus: Sequence[tuple[str, int | None]],
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The spec, and the CDI device IDs of each GPU (by device name): ``gpus`` are the claim's
    (device name, minor number of /dev/nvidiaN or None when unknown)."""
    folder = layout.container_base / namespace / pod
    try:
        environment, shared = preload(layout, folder)
    except AllocationError as error:
        raise ClaimError(str(error)) from None
    environment |= {"POD_NAME": pod, "POD_NAMESPACE": namespace}
    mounts = [
        *((host, at, "ro" if read_only else "rw") for host, at, read_only in shared),
        (layout.host_base / namespace / pod, folder, "rw"),
    ]
    common = {
        "name": claim_uid,
        "containerEdits": {
            "env": [f"{key}={value}" for key, value in environment.items()],
            "mounts": [
                {
                    "hostPath": str(host),
                    "containerPath": str(at),
                    "options": [mode, "nosuid", "nodev", "bind"],
                }
                for host, at, mode in mounts
            ],
            "deviceNodes": _nodes(layout, CONTROL_DEVICES),
        },
    }
    devices: list[dict[str, Any]] = [common]
    ids: dict[str, list[str]] = {}
    for name, minor in gpus:
        ids[name] = [device_id(claim_uid)]
        nodes = _nodes(layout, [f"nvidia{minor}"] if minor is not None else [])
        if nodes:
            own = f"{claim_uid}-{name}"
            devices.append({"name": own, "containerEdits": {"deviceNodes": nodes}})
            ids[name].append(device_id(own))
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices}, ids


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
