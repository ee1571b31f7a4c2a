"""Allocate's answer: what makes a container limited, before its pod is known.

The kubelet's Allocate names devices, never the pod. The answer mounts a folder of the
allocation's own as the container's pod folder (``{container_base}/pod``, SHM_PATH); the daemon
links the pod's region into it once the kubelet's PodResources API says which pod holds the
devices (binding.py), and the container's processes wait for it (TF_REGION_WAIT).
docs/device-plugin.md says more.
"""

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vgpu_common.limits import GpuLimits

from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.resources import gpu_of
from vgpu_hypervisor.kubernetes.annotations import NodeGpu, ResourceNames
from vgpu_hypervisor.kubernetes.model import KubePod, UserGroup
from vgpu_hypervisor.kubernetes.resolver import resolve

NodePods = Callable[[], Sequence[KubePod]]  # the node's pods, as the pod source knows them
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
POD_FOLDER = "pod"  # the allocation's folder in the container, under its base path (SHM_PATH)


class AllocationError(Exception):
    """Allocate cannot be answered; one line, sent to the kubelet as the gRPC error."""


class InvalidRequest(AllocationError):
    """A request no kubelet sends (INVALID_ARGUMENT rather than FAILED_PRECONDITION)."""


def check_request(request: api_pb2.AllocateRequest, known: Collection[str], resource: str) -> None:
    """Every container's request before anything is made, so that a bad one leaves nothing
    behind: InvalidRequest for one that names no device (its allocation would never be bound:
    no pod holds it), AllocationError naming devices the plugin does not advertise."""
    for index, one in enumerate(request.container_requests):
        if not one.devices_ids:
            raise InvalidRequest(f"container request {index} names no {resource} device")
        unknown = sorted({one_id for one_id in one.devices_ids if one_id not in known})
        if unknown:
            raise AllocationError(f"unknown {resource} device(s) {unknown}")


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


def pod_region(
    pod: KubePod, layout: Layout, uuids: Sequence[str]
) -> tuple[dict[str, GpuLimits], UserGroup]:
    """The pod's limits on the GPUs Allocate gave it and its region's owner, resolved as the
    pod source resolves them (kubernetes/resolver.py): its resources the ceiling (a whole GPU
    where it asks for no memory or compute), its annotations lower, the owner from its
    security context. The pod source reports the problems; AllocationError for a GPU the
    resolver gives no limits (never a region without them)."""
    listed = {gpu.uuid.lower() for gpu in layout.gpus}
    # A GPU the layout does not know still gets limits (its size unknown: no memory bound).
    gpus = [*layout.gpus, *(NodeGpu(-1, u, "") for u in uuids if u.lower() not in listed)]
    found = resolve(pod, gpus, layout.names, assigned=uuids)
    limits = found.limits()
    chosen = {}
    for uuid in uuids:
        one = limits.get(_same(uuid, limits))
        if one is None:
            # The kubelet gave the pod this GPU for a share the resolver does not see: a region
            # without its limits would let the pod use the whole GPU uncharged.
            raise AllocationError(
                f"pod {pod.key}: holds GPU {uuid} but asks for no {layout.names.gpu} share "
                "the daemon can read: its region is not made"
            )
        chosen[uuid] = one
    return chosen, found.owner


def _same(uuid: str, limits: Mapping[str, GpuLimits]) -> str:
    """The key of ``limits`` that names ``uuid`` (UUIDs compare in any case)."""
    return next((key for key in limits if key.lower() == uuid.lower()), uuid)


def preload(layout: Layout, folder: Path) -> tuple[dict[str, str], list[tuple[Path, Path, bool]]]:
    """What every container given a GPU share gets, whichever way it was given (Allocate here, a
    DRA claim's CDI spec): the env that preloads the two libraries and names the pod's region
    folder ``folder`` (the container's path), and the read-only mounts (host, container) of the
    libraries and the node's lease folder. AllocationError when a library is not on the host.
    TF_REGION_REQUIRED: the region is the daemon's to make; a process that finds none fails
    rather than make one that would hold no limit."""
    for library in LIBRARIES:
        if not (layout.host_lib_dir / library).is_file():
            raise AllocationError(
                f"{layout.host_lib_dir / library} is missing: install the libraries on the "
                "node (--device-plugin-lib-dir)"
            )
    inside = [layout.container_lib_dir / library for library in LIBRARIES]
    env = {
        # add-path first: it keeps the limiter in LD_PRELOAD (TF_LD_PRELOAD) for children
        # whose environment another preload rewrote.
        "LD_PRELOAD": ":".join(map(str, inside)),
        "TF_LD_PRELOAD": str(inside[1]),
        "SHM_BASE_PATH": str(layout.container_base),
        "SHM_PATH": str(folder),
        "TF_REGION_REQUIRED": "1",
    }
    mounts = [
        *(
            (layout.host_lib_dir / library, at, True)
            for library, at in zip(LIBRARIES, inside, strict=True)
        ),
        (layout.host_base / ".node", layout.container_base / ".node", True),
    ]
    return env, mounts


def container_response(
    layout: Layout,
    *,
    device_ids: Sequence[str],
    host_folder: Path,
    minors: Mapping[str, int],
    region_wait_s: int,
) -> api_pb2.ContainerAllocateResponse:
    """Env, mounts and device nodes for one container. No limit is in the env: the pod's
    region holds them (and the daemon changes them there live), linked into ``host_folder``
    (the allocation's) once the allocation is bound to its pod; TF_REGION_WAIT makes a process
    started before that wait for it, TF_REGION_REQUIRED makes one that still finds none fail
    rather than make one that would hold no limit."""
    uuids = sorted({gpu_of(one) for one in device_ids})
    folder = layout.container_base / POD_FOLDER
    envs, shared = preload(layout, folder)
    envs |= {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids), "TF_REGION_WAIT": str(region_wait_s)}
    # Read-only but for the allocation's folder; the rest of the base path (other pods, the lease
    # files any member of their group could truncate) is not mounted at all. The device leases
    # come from the daemon's arbiter, through its socket in .node (docs/security.md).
    mounts = [
        *shared,
        (host_folder, folder, False),
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
