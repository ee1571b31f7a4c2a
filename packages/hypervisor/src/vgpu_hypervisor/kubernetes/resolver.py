"""A pod's limits per GPU: its resources set the ceiling, its annotations may only lower it.

The one resolver of the Kubernetes door: the pod source (pod_source.py) and the device
plugin's Allocate (device_plugin/allocation.py) both call :func:`resolve`.

The ceiling of each GPU of a pod is what the scheduler charged for it:

- memory: ``vgpu.io/gpu-memory`` units (the pod's effective request, requests.py: its
  containers, which share one region, summed, init containers and sidecars counted as
  Kubernetes counts them) when the pod asks for them, else the default
  (``default_gpu_memory``, at most the GPU's memory), else the GPU's whole memory;
- compute: ``vgpu.io/gpu-compute`` percent (the effective request) when asked, else the default
  (``default_gpu_compute``), else 100 %.

So with the defaults unset a pod asking only ``vgpu.io/gpu: 1`` gets one whole GPU, bounded by
that GPU's memory, as the NVIDIA device plugin gives one; a pod asking for memory or compute
gets exactly that. The device plugin charges each GPU of a pod these ceilings
(device_plugin/accounting.py), so a default is charged as well as enforced. A pod
with no vgpu resource at all (annotations alone) has no resource ceiling; the pod source holds
it to the limits it started with, and a limit an admin changed through the API becomes that
GPU's ceiling: both come in as ``ceilings`` and take the resources' place.

Annotations may only lower a ceiling. One asking more is refused: a line naming the pod, the
annotation, its value and what set the ceiling, and the ceiling applies. Without annotations
a pod has its ceiling, never no limit.

The region's owner comes from the pod's security context (:func:`region_owner`), so that the
pod's processes can open a region the daemon made for them when they do not run as root.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from vgpu_common.limits import (
    HUNDREDTHS_PER_PERCENT,
    UNCHANGED,
    WHOLE_GPU,
    GpuLimits,
    Qos,
    format_percent,
    format_size,
    hundredths_to_percent,
    parse_qos,
    parse_switch,
)

from vgpu_hypervisor.kubernetes.annotations import (
    COMPUTE_BURST,
    COMPUTE_LIMIT,
    DEFAULT_NAMES,
    GPU_IDS,
    PREFIX,
    QOS,
    TFLOPS_LIMIT,
    VRAM_LIMIT,
    VRAM_OVERSUBSCRIBE,
    Asked,
    NodeGpu,
    ResourceNames,
    check_keys,
    limit_values,
    match_gpu,
    parse_gpu_ids,
    peak_tflops,
)
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod, UserGroup
from vgpu_hypervisor.kubernetes.requests import effective_requests


@dataclass(frozen=True)
class Ceiling:
    """The most one limit of a GPU may be (bytes or hundredths of a percent; None: no bound)
    and what set it, in words that follow "the ceiling from"."""

    value: int | None
    source: str


@dataclass(frozen=True)
class GpuCeiling:
    """A GPU's ceilings. Given to :func:`resolve`, a field left None is the resources'."""

    memory: Ceiling | None = None
    compute: Ceiling | None = None


@dataclass(frozen=True)
class Resolution:
    """What a pod gets: ``gpus`` by GPU UUID (empty when it asks for no vgpu share; their
    ``oversubscribe`` is the pod's, ``oversubscribe`` here), the
    ``ceilings`` they were held to (both fields set), ``problems`` one line each (a value that
    cannot be read, two that disagree) and ``refused`` one line per annotation that asked for
    more than its ceiling."""

    wants_gpu: bool
    gpus: Mapping[str, GpuLimits] = field(default_factory=dict)
    ceilings: Mapping[str, GpuCeiling] = field(default_factory=dict)
    from_resources: bool = False  # the pod asks for a vgpu resource (else annotations alone)
    qos: Qos | None = None
    oversubscribe: bool = False
    problems: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    owner: UserGroup = field(default_factory=UserGroup)  # None: the daemon's (root)

    def limits(self, keep_burst: frozenset[str] = frozenset()) -> dict[str, GpuLimits]:
        """The limits to write through the PodStore; the GPUs in ``keep_burst`` keep the
        burst their region holds (an admin set it)."""
        return {
            uuid: dataclasses.replace(
                gpu,
                # past a memory limit: a GPU without one has nothing to oversubscribe (resolve
                # says so)
                oversubscribe=self.oversubscribe and gpu.memory is not None,
                burst=UNCHANGED if uuid in keep_burst else gpu.burst,
            )
            for uuid, gpu in self.gpus.items()
        }


class _Lines:
    def __init__(self, pod: KubePod) -> None:
        self.pod = pod
        self.problems: list[str] = []
        self.refused: list[str] = []

    def _line(self, where: str, value: str, why: str) -> str:
        shown = value if len(value) <= 80 else value[:77] + "..."
        return f"pod {self.pod.key}: {where}={shown!r}: {why}"

    def problem(self, where: str, value: str, why: str) -> None:
        self.problems.append(self._line(where, value, why))

    def refuse(self, asked: Asked, ceiling: str, source: str) -> None:
        why = (
            f"asks more than {ceiling}, the ceiling from {source}; annotations only lower "
            f"limits, so {ceiling} applies"
        )
        self.refused.append(self._line(asked.key, asked.text, why))


@dataclass(frozen=True)
class _Resources:
    """The pod's effective request of the vgpu resources; None where no container asks."""

    count: int | None
    memory_units: int | None
    compute: int | None

    @property
    def any(self) -> bool:
        return (self.count, self.memory_units, self.compute) != (None, None, None)


def resolve(
    pod: KubePod,
    gpus: Sequence[NodeGpu],
    names: ResourceNames = DEFAULT_NAMES,
    assigned: Sequence[str] = (),
    ceilings: Mapping[str, GpuCeiling] | None = None,
) -> Resolution:
    """The limits ``pod`` gets on this node's ``gpus``. ``assigned``: the GPUs (indices or
    UUIDs) the device plugin gave it, which are its GPUs whatever ``gpu-ids`` says; without
    them ``gpu-ids``, else every GPU of the node (a container sees only those it was given, so
    the others are never charged). ``ceilings`` by GPU UUID replace the resources' (the pod
    source's: an admin's change, or the limits an annotations-only pod started with); a pod
    with ceilings wants its GPUs even once its annotations are gone."""
    lines = _Lines(pod)
    ours = any(key.startswith(PREFIX) for key in pod.annotations)
    resources = _resources(pod, names, lines)
    if not ours and not resources.any and not lines.problems and not ceilings:
        return Resolution(wants_gpu=False)
    chosen = _choose_gpus(
        pod, gpus, assigned=assigned, resources=resources, names=names, lines=lines
    )
    pod_wide = limit_values(pod.annotations, "", lines.problem)
    limits: dict[str, GpuLimits] = {}
    held: dict[str, GpuCeiling] = {}
    for gpu in chosen:
        given = (ceilings or {}).get(gpu.uuid, GpuCeiling())
        ceiling = GpuCeiling(
            memory=given.memory or _memory_ceiling(gpu, resources, names),
            compute=given.compute or _compute_ceiling(resources, names),
        )
        held[gpu.uuid] = ceiling
        limits[gpu.uuid] = _gpu_limits(pod, gpu, pod_wide, ceiling, lines)
    check_keys(pod.annotations, chosen, lines.problem)
    qos: Qos | None = None
    if (text := pod.annotations.get(QOS)) is not None:
        try:
            qos = parse_qos(text)
        except ValueError as error:
            lines.problem(QOS, text, str(error))
    oversubscribe = False
    if (text := pod.annotations.get(VRAM_OVERSUBSCRIBE)) is not None:
        try:
            oversubscribe = parse_switch(text)
        except ValueError as error:
            lines.problem(VRAM_OVERSUBSCRIBE, text, str(error))
        unlimited = [str(gpu.index) for gpu in chosen if limits[gpu.uuid].memory is None]
        if oversubscribe and unlimited:
            why = f"GPU {', '.join(unlimited)} has no memory limit to oversubscribe: ignored there"
            lines.problem(VRAM_OVERSUBSCRIBE, text or "", why)
    return Resolution(
        wants_gpu=True,
        gpus=limits,
        ceilings=held,
        from_resources=resources.any,
        qos=qos,
        oversubscribe=oversubscribe,
        problems=tuple(lines.problems),
        refused=tuple(lines.refused),
        owner=region_owner(pod, names),
    )


def region_owner(
    pod: KubePod, names: ResourceNames = DEFAULT_NAMES, *, claims: Collection[str] = ()
) -> UserGroup:
    """Who the pod's region file belongs to (the daemon keeps its folder: docs/security.md).

    Its users are the processes of the containers that use the region: those asking for a
    vgpu resource, those given one of the ResourceClaims `claims` (DRA: a container that names
    one of the pod's claims that is one of these), or every container of a pod with neither.
    The DRA driver passes every claim of the pod it serves, not only the one it prepares: the
    containers of each open the pod's one region. Before, only the prepared claim's counted:
    the region went to the users of whichever claim came first, and a container of another
    claim running as another user could not open it. Before that, every container of a DRA
    pod counted, init containers and sidecars among them: a GPU container running as a user
    beside a mesh proxy running as another (or an init container as root) got a region of
    root's that it could not open. As in Kubernetes, a container's processes run as its own
    securityContext's runAsUser and runAsGroup where it sets them, else as the pod's, else as
    its image says (which the daemon cannot know), and carry the pod's fsGroup as a
    supplementary group. So:

    - the user is the one runAsUser all of them run as; none when one runs as its image says
      or two differ (the limiter opens no region that another non-root user owns, so those
      processes must come in through the group);
    - the group is fsGroup, else the one runAsGroup all of them run as.

    Root (0) is no owner: such a region stays root's, as a pod without a security context's.
    """
    wanted = (names.gpu, names.memory, names.compute)
    given = {name for name, named in pod.claim_objects.items() if named in claims}
    users = [
        c
        for c in pod.containers
        if any(name in c.resources for name in wanted) or given.intersection(c.claims)
    ]
    users = users or list(pod.containers)
    user = _shared(users, pod, lambda ids: ids.user)
    group = pod.fs_group if pod.fs_group else _shared(users, pod, lambda ids: ids.group)
    return UserGroup(user or None, group or None)


def _shared(
    containers: Sequence[KubeContainer],
    pod: KubePod,
    field_of: Callable[[UserGroup], int | None],
) -> int | None:
    """The value every container runs with (its own, else the pod's); None unless one."""
    values = {
        field_of(c.run_as) if field_of(c.run_as) is not None else field_of(pod.run_as)
        for c in containers
    }
    return values.pop() if len(values) == 1 else None


def _resources(pod: KubePod, names: ResourceNames, lines: _Lines) -> _Resources:
    def problem(container: KubeContainer, resource: str, text: str, why: str) -> None:
        lines.problem(f"container {container.name} resource {resource}", text, why)

    wanted = (names.gpu, names.memory, names.compute)
    totals = effective_requests(pod.containers, wanted, problem)
    memory = totals.get(names.memory)
    if memory == 0:  # nothing charged: 0 bytes is no limit to a region, so it is not one
        lines.problem(f"resource {names.memory}", "0", "expected at least 1 unit")
        memory = None
    compute = totals.get(names.compute)
    if compute is not None and not 1 <= compute <= 100:
        lines.problem(f"resource {names.compute}", str(compute), "expected 1 to 100")
        compute = None
    return _Resources(totals.get(names.gpu), memory, compute)


def _memory_ceiling(gpu: NodeGpu, resources: _Resources, names: ResourceNames) -> Ceiling:
    if resources.memory_units is not None:
        unit = format_size(names.memory_unit)
        return Ceiling(
            resources.memory_units * names.memory_unit,
            f"resource {names.memory}={resources.memory_units} (units of {unit})",
        )
    if not resources.any:
        return Ceiling(gpu.memory_total, f"the whole GPU {gpu.index}")
    default = names.default_memory
    if default is not None and (gpu.memory_total is None or default < gpu.memory_total):
        why = f"the default memory {format_size(default)} (no {names.memory} asked)"
        return Ceiling(default, why)
    return Ceiling(gpu.memory_total, f"the whole GPU {gpu.index} (no {names.memory} asked)")


def _compute_ceiling(resources: _Resources, names: ResourceNames) -> Ceiling:
    if resources.compute is not None:
        return Ceiling(
            resources.compute * HUNDREDTHS_PER_PERCENT,
            f"resource {names.compute}={resources.compute}",
        )
    if resources.any and names.default_compute is not None:
        why = f"the default compute {_shown(names.default_compute)} (no {names.compute} asked)"
        return Ceiling(names.default_compute, why)
    return Ceiling(None, "the whole GPU")


def _choose_gpus(
    pod: KubePod,
    gpus: Sequence[NodeGpu],
    *,
    assigned: Sequence[str],
    resources: _Resources,
    names: ResourceNames,
    lines: _Lines,
) -> list[NodeGpu]:
    """The GPUs of the pod: those the device plugin gave, else gpu-ids, else every GPU."""
    ids_text = pod.annotations.get(GPU_IDS)
    named: tuple[str, ...] = ()
    if ids_text is not None:
        try:
            named = parse_gpu_ids(ids_text)
        except ValueError as error:
            lines.problem(GPU_IDS, ids_text, str(error))
    if assigned:
        # The GPUs the container sees: limits put on others would leave its own as they were.
        chosen = [gpu for one in assigned if (gpu := match_gpu(one, gpus)) is not None]
        elsewhere = {gpu.uuid for one in named if (gpu := match_gpu(one, gpus)) is not None}
        if ids_text is not None and named and elsewhere != {gpu.uuid for gpu in chosen}:
            given = ", ".join(str(gpu.index) for gpu in chosen)
            why = f"the device plugin gave the pod GPU {given}, where its limits apply"
            lines.problem(GPU_IDS, ids_text, why)
        return chosen
    if not named or ids_text is None:
        return list(gpus)
    chosen = []
    for gpu_id in named:
        found = match_gpu(gpu_id, gpus)
        if found is None:
            lines.problem(GPU_IDS, ids_text, f"this node has no GPU {gpu_id}")
        else:
            chosen.append(found)
    if resources.count is not None and resources.count != len(named):
        why = f"names {len(named)} GPU(s) but resource {names.gpu} asks {resources.count}"
        lines.problem(GPU_IDS, ids_text, why)
    return chosen


def _gpu_limits(
    pod: KubePod,
    gpu: NodeGpu,
    pod_wide: Mapping[str, Asked],
    ceiling: GpuCeiling,
    lines: _Lines,
) -> GpuLimits:
    """One GPU's limits: its annotations (its own over the pod-wide ones) under its ceiling."""
    values = dict(pod_wide)
    for key in (str(gpu.index), gpu.uuid):
        values |= limit_values(pod.annotations, "." + key, lines.problem)
    assert ceiling.memory is not None and ceiling.compute is not None
    memory = _held(values.get(VRAM_LIMIT), ceiling.memory, format_size, lines)
    compute = _held(_compute_asked(gpu, values, lines), ceiling.compute, _shown, lines)
    if compute == WHOLE_GPU:
        compute = None  # the whole GPU is no limit
    burst = values.get(COMPUTE_BURST)
    if burst is not None and compute is None:
        lines.problem(burst.key, burst.text, "a burst needs a compute limit below 100 %: ignored")
        burst = None
    elif burst is not None and compute is not None and burst.value < compute:
        why = f"below the compute limit {_shown(compute)}: ignored"
        lines.problem(burst.key, burst.text, why)
        burst = None
    return GpuLimits(
        memory=memory, compute=compute, burst=None if burst is None else int(burst.value)
    )


def _held(
    asked: Asked | None, ceiling: Ceiling, shown: Callable[[int], str], lines: _Lines
) -> int | None:
    """What an annotation asks, unless it is above the ceiling (refused: the ceiling)."""
    if asked is None:
        return ceiling.value
    if ceiling.value is not None and asked.value > ceiling.value:
        lines.refuse(asked, shown(ceiling.value), ceiling.source)
        return ceiling.value
    return int(asked.value)


def _shown(compute: int) -> str:
    """A compute limit in hundredths, as the messages show it."""
    return format_percent(hundredths_to_percent(compute))


def _compute_asked(gpu: NodeGpu, values: Mapping[str, Asked], lines: _Lines) -> Asked | None:
    """compute-limit, or tflops-limit as percent of this GPU's peak; the lower of the two
    (a problem when they disagree)."""
    compute = values.get(COMPUTE_LIMIT)
    tflops = values.get(TFLOPS_LIMIT)
    if tflops is None:
        return compute
    peak = peak_tflops(gpu.name)
    if peak is None:
        why = f"GPU {gpu.index} ({gpu.name}) is not in the peak TFLOPS table"
        lines.problem(tflops.key, tflops.text, why)
        return compute
    if tflops.value > peak:
        lines.problem(tflops.key, tflops.text, f"above GPU {gpu.index}'s peak of {peak:g} TFLOPS")
        return compute
    # In hundredths, at least the least share there is.
    converted = Asked(max(1, round(WHOLE_GPU * tflops.value / peak)), tflops.key, tflops.text)
    if compute is None:
        return converted
    if compute.value != converted.value:
        lines.problem(
            tflops.key,
            tflops.text,
            f"is {_shown(int(converted.value))} of GPU {gpu.index}, contradicting "
            f"{compute.key}={hundredths_to_percent(int(compute.value)):g}; the lower applies",
        )
    return min(compute, converted, key=lambda one: one.value)
