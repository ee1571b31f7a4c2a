"""Allocate: which pod a container belongs to, and what makes that container limited.

The kubelet's Allocate names devices, never the pod. The pod is found among this node's
pending pods that ask for the GPU resource: the oldest (creation time, then namespace/name)
with a container that asks for as many GPU devices as the request holds and has not been
allocated yet. The kubelet admits one pod at a time, so this is right unless two pending pods
ask for the same number of GPUs and the kubelet admits the younger first; then the two swap
limits (each still gets as many GPUs as it asked for). docs/device-plugin.md says more.
"""

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vgpu_common.limits import NO_LIMITS, GpuLimits, parse_quantity

from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.resources import gpu_of
from vgpu_hypervisor.kubernetes.annotations import NodeGpu, ResourceNames
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod, UserGroup
from vgpu_hypervisor.kubernetes.resolver import resolve

PendingPods = Callable[[], Sequence[KubePod]]
# Makes sure the pod's region exists (with these limits and this owner when it is new); its
# folder on the host and the limits the region holds now for those GPUs (the pod source's,
# annotations included).
PreparePod = Callable[
    [KubePod, Mapping[str, GpuLimits], UserGroup], tuple[Path, Mapping[str, GpuLimits]]
]
LIBRARIES = ("libadd_path.so", "libcuda_limiter.so")
# NVIDIA's node-wide device files that CUDA needs, passed whether the daemon's own container
# sees them or not (with NVIDIA_DRIVER_CAPABILITIES=utility it has no /dev/nvidia-uvm): the
# host has them wherever the driver is loaded. The per-GPU /dev/nvidiaN come from the GPUs'
# NVML minor numbers, so they need not be seen either.
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
# Passed where the daemon sees them under dev_root (display nodes CUDA does not need).
OPTIONAL_DEVICES = ("nvidia-modeset",)
# Where the NVIDIA container runtime looks for the GPUs given as mounts (its volume-mounts
# device list strategy).
DEVICE_LIST = Path("/var/run/nvidia-container-devices")


class AllocationError(Exception):
    """Allocate cannot be answered; one line, sent to the kubelet as the gRPC error."""


@dataclass(frozen=True)
class Layout:
    """Where things are on the host and in the container."""

    host_lib_dir: Path  # holds LIBRARIES, installed on the host
    host_base: Path  # the daemon's shm base path
    container_lib_dir: Path = Path("/usr/local/vgpu/lib")
    container_base: Path = Path("/run/tensor-fusion/shm")
    dev_root: Path = Path("/dev")
    names: ResourceNames = field(default_factory=ResourceNames)  # with the memory unit
    # The node's GPUs (index, name, memory): a pod asking for a whole GPU gets its memory.
    gpus: tuple[NodeGpu, ...] = ()


def requested(pod: KubePod, container: KubeContainer, name: str) -> int:
    """The whole number of ``name`` a container asks for (0 when none)."""
    text = container.resources.get(name)
    if text is None:
        return 0
    try:
        return parse_quantity(text)
    except ValueError as error:
        raise AllocationError(
            f"pod {pod.key} container {container.name}: {name}: {error}"
        ) from None


class PodMatcher:
    """Finds the pod of each Allocate and remembers the containers already given GPUs."""

    def __init__(self, pending: PendingPods, names: ResourceNames) -> None:
        self._pending = pending
        self._names = names
        self._taken: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def match(self, count: int) -> tuple[KubePod, KubeContainer]:
        """The oldest pending container asking for ``count`` GPU devices, now taken."""
        with self._lock:
            pods = [p for p in self._pending() if p.phase == "Pending" and not p.deleting]
            live = {pod.uid for pod in pods}
            self._taken = {taken for taken in self._taken if taken[0] in live}
            asking = 0
            for pod in sorted(pods, key=lambda p: (p.created, p.key)):
                for container in pod.containers:
                    wanted = requested(pod, container, self._names.gpu)
                    if wanted == 0 or (pod.uid, container.name) in self._taken:
                        continue
                    asking += 1
                    if wanted == count:
                        self._taken.add((pod.uid, container.name))
                        return pod, container
            raise AllocationError(
                f"no pending pod on this node has a container asking for {count} "
                f"{self._names.gpu} ({asking} pending container(s) ask for another count "
                "or none is known yet)"
            )


def pod_region(
    pod: KubePod, layout: Layout, uuids: Sequence[str]
) -> tuple[dict[str, GpuLimits], UserGroup]:
    """The pod's limits on the GPUs Allocate gave it and its region's owner, resolved as the
    pod source resolves them (kubernetes/resolver.py): its resources the ceiling (a whole GPU
    where it asks for no memory or compute), its annotations lower, the owner from its
    security context. The pod source reports the problems."""
    listed = {gpu.uuid.lower() for gpu in layout.gpus}
    # A GPU the layout does not know still gets limits (its size unknown: no memory bound).
    gpus = [*layout.gpus, *(NodeGpu(-1, u, "") for u in uuids if u.lower() not in listed)]
    found = resolve(pod, gpus, layout.names, assigned=uuids)
    limits = found.limits()
    chosen = {uuid: limits.get(_same(uuid, limits), NO_LIMITS) for uuid in uuids}
    return chosen, found.owner


def _same(uuid: str, limits: Mapping[str, GpuLimits]) -> str:
    """The key of ``limits`` that names ``uuid`` (UUIDs compare in any case)."""
    return next((key for key in limits if key.lower() == uuid.lower()), uuid)


def container_response(
    layout: Layout,
    pod: KubePod,
    container: KubeContainer,
    *,
    device_ids: Sequence[str],
    host_folder: Path,
    minors: Mapping[str, int],
) -> api_pb2.ContainerAllocateResponse:
    """Env, mounts and device nodes for one container. No limit is in the env: the pod's
    region, made before Allocate answers, holds them (and the daemon changes them there live);
    TF_REGION_REQUIRED makes a process that finds it missing fail rather than make one that
    would hold none."""
    uuids = sorted({gpu_of(one) for one in device_ids})
    for library in LIBRARIES:
        if not (layout.host_lib_dir / library).is_file():
            raise AllocationError(
                f"{layout.host_lib_dir / library} is missing: install the libraries on the "
                "node (--device-plugin-lib-dir)"
            )
    libs = [str(layout.container_lib_dir / library) for library in LIBRARIES]
    folder = layout.container_base / pod.namespace / pod.name
    envs = {
        # add-path first: it keeps the limiter in LD_PRELOAD (TF_LD_PRELOAD) for children
        # whose environment another preload rewrote.
        "LD_PRELOAD": ":".join(libs),
        "TF_LD_PRELOAD": libs[1],
        "SHM_BASE_PATH": str(layout.container_base),
        "SHM_PATH": str(folder),
        "POD_NAME": pod.name,
        "POD_NAMESPACE": pod.namespace,
        "CONTAINER_NAME": container.name,
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
        "TF_REGION_REQUIRED": "1",
    }
    # Read-only but for the pod's own folder; the rest of the base path (other pods, the lease
    # files any member of their group could truncate) is not mounted at all. The device leases
    # come from the daemon's arbiter, through its socket in .node (docs/security.md).
    mounts = [
        (layout.host_lib_dir / LIBRARIES[0], Path(libs[0]), True),
        (layout.host_lib_dir / LIBRARIES[1], Path(libs[1]), True),
        (host_folder, folder, False),
        (layout.host_base / ".node", layout.container_base / ".node", True),
        # The same GPUs as a list of mounts, for an NVIDIA container runtime that ignores
        # NVIDIA_VISIBLE_DEVICES from unprivileged containers (docs/kubernetes.md): it reads
        # the names under this folder instead, as NVIDIA's device plugin gives them.
        *((Path("/dev/null"), DEVICE_LIST / uuid, True) for uuid in uuids),
    ]
    unknown = [u for u in uuids if u not in minors]
    if unknown:
        raise AllocationError(
            f"GPU {unknown[0]}: NVML gave no minor number, so its /dev/nvidiaN is unknown"
        )
    names = [
        *CONTROL_DEVICES,
        *(f"nvidia{minors[u]}" for u in uuids),
        *(name for name in OPTIONAL_DEVICES if (layout.dev_root / name).exists()),
    ]
    devices = [
        api_pb2.DeviceSpec(
            container_path=f"/dev/{name}", host_path=str(layout.dev_root / name), permissions="rw"
        )
        for name in names
    ]
    return api_pb2.ContainerAllocateResponse(
        envs=envs,
        mounts=[
            api_pb2.Mount(container_path=str(inside), host_path=str(host), read_only=read_only)
            for host, inside, read_only in mounts
        ],
        devices=devices,
    )
