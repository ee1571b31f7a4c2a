"""What the daemon shows and takes: the API's documents (and the CLI's `--json`).

Units: memory in bytes, utilization and compute limits in percent, times in Unix seconds.
A value the driver could not give is null.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, WithJsonSchema
from vgpu_common.limits import (
    MAX_WEIGHT,
    QOS_NAMES,
    UNCHANGED,
    GpuLimits,
    Limit,
    Qos,
    Unchanged,
    parse_burst_limit,
    parse_compute_limit,
    parse_gpu_key,
    parse_memory_limit,
    parse_qos,
)

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$"


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- requests -----------------------------------------------------------------------------
# A limit in a request is parsed here, once, into vgpu_common.limits' value (bytes, hundredths
# of a percent); null or absent leaves it as it is, "none" is no limit.


def _limit(parse: Callable[[object], int | None]) -> Callable[[object], Limit]:
    def value(given: object) -> Limit:
        return UNCHANGED if given is None else parse(given)

    return value


def _whole(given: object) -> object:
    """A float that is a whole number as that number: JSON has one kind of number, and clients
    write a computed size as 4294967296.0 (the schema's integer allows it). Settings files,
    whose TOML tells floats from integers, still refuse one."""
    if isinstance(given, float) and math.isfinite(given) and given.is_integer():
        return int(given)
    return given


# An id or a weight is a JSON integer, and only that: pydantic's lax mode took true as 1 (an
# owner of true made the region uid 1's) and "5" as 5. A whole float is still the integer it
# writes, as for a memory size. (Its range sits on the integer: on the field it is applied
# to a null too.)
IdField = Annotated[
    Annotated[int, Strict(), Field(ge=0, le=0xFFFFFFFE)] | None, BeforeValidator(_whole)
]


def _boolean(given: object) -> bool | Unchanged:
    if given is None:
        return UNCHANGED
    if not isinstance(given, bool):  # JSON's true or false, not a word for one
        raise ValueError("expected true or false")
    return given


def _schema(*kinds: dict[str, Any], description: str) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [*kinds, {"type": "null"}], "description": description})


_NUMBER_OR_TEXT = ({"type": "number"}, {"type": "string"})
MemoryField = Annotated[
    Limit,
    BeforeValidator(_limit(lambda given: parse_memory_limit(_whole(given)))),
    _schema(
        {"type": "integer", "minimum": 0},
        {"type": "string"},
        description='Bytes, or a size such as "4GiB"; "none" (or 0): no limit.',
    ),
]
ComputeField = Annotated[
    Limit,
    BeforeValidator(_limit(parse_compute_limit)),
    _schema(
        *_NUMBER_OR_TEXT,
        description="Share of the GPU's time in percent, 0.01 to 100 with at most two "
        'decimals; "none" (or 100): no limit.',
    ),
]
BurstField = Annotated[
    Limit,
    BeforeValidator(_limit(parse_burst_limit)),
    _schema(
        *_NUMBER_OR_TEXT,
        description="Soft limit in percent (>= compute): the pod's share while no other pod "
        'wants the GPU, 100: all idle time; "none": no burst.',
    ),
]
OversubscribeField = Annotated[
    bool | Unchanged,
    BeforeValidator(_boolean),
    _schema(
        {"type": "boolean"},
        description="Past the memory limit, serve allocations from host memory instead of failing.",
    ),
]


def _absent() -> Any:
    """An absent limit: UNCHANGED, which the schema shows as null (its JSON spelling)."""
    return Field(default=UNCHANGED, json_schema_extra={"default": None})


class GpuLimitsRequest(_Document):
    """Limits of one GPU of a pod; an absent or null limit is left as it is (none on a GPU
    new to the pod)."""

    memory: MemoryField = _absent()
    compute: ComputeField = _absent()
    burst: BurstField = _absent()
    oversubscribe: OversubscribeField = _absent()

    def limits(self) -> GpuLimits:
        """The value these fields make (the Python side of the API)."""
        return GpuLimits(self.memory, self.compute, self.burst, self.oversubscribe)


def _gpu_keys(value: Any) -> Any:
    if isinstance(value, dict):
        for key in value:
            parse_gpu_key(str(key))
    return value


GpuMap = Annotated[
    dict[str, GpuLimitsRequest],
    BeforeValidator(_gpu_keys),
    Field(description="Limits by GPU index or UUID.", min_length=1, max_length=16),
]


QosField = Annotated[
    Qos | None,
    BeforeValidator(lambda given: None if given is None else parse_qos(given)),
    _schema(
        {"type": "string", "enum": list(QOS_NAMES)},
        description="Scheduling class: the weight (1/2/4/8) when the GPU's limits add up past "
        "100 % and no weight is given. Default medium.",
    ),
]
WeightField = Annotated[
    Annotated[int, Strict(), Field(ge=0, le=MAX_WEIGHT)] | None,
    BeforeValidator(_whole),
    Field(description="Explicit scheduling weight (0: from the qos)."),
]


class PodCreate(_Document):
    """A new pod: its name, namespace and limits per GPU."""

    name: str = Field(pattern=NAME_PATTERN)
    namespace: str = Field(default="default", pattern=NAME_PATTERN)
    gpus: GpuMap
    # Who may open the pod's region (mode 0660): its user, or a group its users share; the
    # daemon's own user (root) when not given (docs/security.md).
    owner: IdField = Field(default=None, description="uid of the pod")
    group: IdField = Field(default=None, description="gid of the pod")
    qos: QosField = None
    weight: WeightField = None


class PodUpdate(_Document):
    """New limits for some GPUs of a pod (a GPU it has none for is added), or its scheduling
    class and weight."""

    gpus: GpuMap | None = None
    qos: QosField = None
    weight: WeightField = None


# --- responses ----------------------------------------------------------------------------


class Gpu(_Document):
    index: int
    uuid: str | None
    name: str | None
    memory_total: int | None
    memory_used: int | None
    utilization: int | None = Field(description="GPU busy time in percent (NVML).")
    memory_utilization: int | None
    temperature_c: int | None
    power_draw_w: float | None
    sm_clock_mhz: int | None
    boost: float | None = Field(
        description="What limited pods' GPU time is charged times (boost correction); "
        "null: no estimate, or correction off."
    )
    pods: int
    workers: int
    memory_committed: int | None = Field(
        default=None,
        description="Bytes the device plugin has charged pods on this GPU; null: no device "
        "plugin accounts for it.",
    )
    compute_committed: float | None = Field(
        default=None,
        description="Percent of its time the device plugin has charged pods on this GPU; "
        "null: no device plugin accounts for it.",
    )


class PodGpu(_Document):
    uuid: str
    index: int | None = Field(description="The node's index of the GPU; null if not on it.")
    memory_limit: int | None = Field(description="Bytes; null: no memory limit.")
    memory_used: int = Field(description="Bytes the pod holds on the GPU itself.")
    host_memory_used: int = Field(
        default=0, description="Bytes of its oversubscribed allocations, kept in host memory."
    )
    oversubscribe: bool = Field(default=False, description="Past the limit, host memory.")
    compute_limit: float | None = Field(description="Percent; null: no compute limit.")
    compute_burst: float | None = Field(
        default=None, description="Soft limit in percent while the GPU is uncontended; null: none."
    )
    compute_effective: float | None = Field(
        default=None,
        description="Percent the daemon holds the pod to while it divides the GPU among the pods "
        "that want it (weights, what the GPU gives); null: its own limit holds.",
    )
    frozen: bool = Field(default=False, description="A freeze holds the pod's launches here.")
    gpu_seconds: float = Field(default=0.0, description="GPU time charged to the pod.")
    throttled_seconds: float = Field(
        default=0.0, description="Time its launches waited for their share or another pod."
    )
    burst_seconds: float = Field(default=0.0, description="GPU time run above the hard limit.")
    oom_refusals: int = Field(
        default=0, description="Allocations the memory limit refused, since the region was made."
    )
    last_refused_bytes: int | None = Field(
        default=None, description="Size of the last allocation the limit refused; null: none."
    )
    utilization: int | None = Field(description="SM utilization of the pod's workers, percent.")


class Pod(_Document):
    namespace: str
    name: str
    path: str
    created: float | None
    error: str | None = Field(description="Why the region file cannot be read; null if fine.")
    gpus: list[PodGpu]
    workers: int
    phase: str | None = Field(
        default=None, description="The Kubernetes pod's phase; null: not a Kubernetes pod."
    )
    frozen: bool = Field(default=False, description="Its launches wait until resumed.")
    qos: str = Field(default="medium", description="Scheduling class.")
    weight: int = Field(default=2, description="Scheduling weight in effect.")


class WorkerGpu(_Document):
    uuid: str
    memory_used: int
    host_memory_used: int = 0
    utilization: int | None


class Worker(_Document):
    namespace: str
    pod: str
    slot: int
    pid: int = Field(description="In the worker's own pid namespace.")
    host_pid: int | None = Field(description="In the daemon's pid namespace; null if unknown.")
    started: float | None
    command: str | None
    alive: bool
    last_gpu_call: float | None
    gpus: list[WorkerGpu]
    container: str | None = Field(
        default=None, description="Kubernetes container name; null: not known or not in one."
    )
    limited: bool = Field(
        default=True,
        description="False: a process of a Kubernetes pod on the GPU without the limiter.",
    )


class Status(_Document):
    version: str
    backend: str
    backend_description: str
    started: float
    uptime_s: float
    shm_base_path: str
    gpus: int
    pods: int
    pods_with_errors: int
    workers: int
    last_sample: float | None
    ready: bool


class Health(_Document):
    status: str


class Readiness(_Document):
    ready: bool
    checks: dict[str, str]


class ErrorDocument(_Document):
    error: str


def first_problem(problems: Sequence[Mapping[str, Any]], whole: str) -> str:
    """The first of pydantic's ``problems`` with a document, in one line: where it is
    ("gpus.0.memory"; ``whole`` names the document itself) and what, and how many more there
    are. The API's 422 and the client's check of a reply say it alike."""
    if not problems:
        return f"{whole}: invalid"
    first = problems[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or whole
    message = " ".join(str(first.get("msg", "invalid")).removeprefix("Value error, ").split())
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return f"{where}: {message}{more}"
