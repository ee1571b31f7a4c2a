"""The limiter's configuration exactly as libcuda_limiter.so reads it from the environment.

The parsing lives in C (csrc/limiter/config.c) so that Python never disagrees with what is
enforced; this module calls the library's exported ``vgpu_limiter_describe_config`` through
cffi in ABI mode (``ffi.dlopen``), which keeps the library a plain shared object. The library
reads the C environment, which ``os.environ`` assignments update (they call putenv).
"""

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from vgpu_common.limits import hundredths_to_percent

from vgpu_limiter import library_path

_CDEF = "int vgpu_limiter_describe_config(char *out, size_t size);"

KeyKind = Literal["all", "index", "uuid"]
PodSource = Literal[
    "private",
    "SHM_PATH",
    "POD_NAME",
    "VGPU_POD_NAME",
    "TF_SHM_FILE",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
]
LogLevel = Literal["error", "warn", "info", "debug"]


class ConfigError(ValueError):
    """An invalid or contradictory configuration; the message is the library's one line,
    which starts with NAME=VALUE of the offending variable."""


@dataclass(frozen=True)
class DeviceSetting:
    """The limits given for one device key. Index keys mean the CUDA ordinal the program sees;
    UUID keys the physical GPU; "all" comes from CUDA_DEVICE_MEMORY_LIMIT / CUDA_DEVICE_SM_LIMIT.
    For each limit the most specific key that sets it wins: UUID, then index, then all."""

    key: str
    kind: KeyKind
    index: int | None
    uuid: str | None
    memory_limit: int | None  # bytes
    memory_source: str | None  # the variable that set it
    compute_limit: int | None  # hundredths of a percent, 1-10000
    compute_source: str | None
    # How far past compute_limit the pod may burst when the GPU is idle (hundredths).
    soft_limit: int | None = None
    soft_source: str | None = None
    # Allocations past memory_limit go to host-backed memory; None when not given.
    oversubscribe: bool | None = None
    oversubscribe_source: str | None = None

    @property
    def compute_percent(self) -> float | None:
        return None if self.compute_limit is None else hundredths_to_percent(self.compute_limit)


@dataclass(frozen=True)
class PodIdentity:
    """Where the pod's region lives; source "private" means no pod (a private region).
    `base` is the folder of the node's pod regions and device leases (SHM_BASE_PATH or the
    library's default, as `base_source` says)."""

    source: PodSource
    folder: Path | None
    region_file: Path | None
    namespace: str | None
    name: str | None
    container: str | None
    base: Path
    base_source: str
    name_source: str | None = None  # POD_NAME or VGPU_POD_NAME
    uid: str | None = None  # VGPU_POD_UID, recorded
    container_source: str | None = None  # CONTAINER_NAME or VGPU_CONTAINER_NAME
    # TF_REGION_REQUIRED: the node daemon made the region; a process never makes a missing one.
    region_required: bool = False


@dataclass(frozen=True)
class ProcessSettings:
    """Settings of each process, with the variable each came from ("default" when none)."""

    context_overhead: int  # bytes charged per CUDA context
    context_overhead_source: str
    cuda_library: str  # a path or a soname
    cuda_library_source: str
    nvml_library: str
    nvml_library_source: str
    tmp_folder: Path  # where a private region goes
    tmp_source: str


@dataclass(frozen=True)
class LogSettings:
    level: LogLevel
    path: Path | None  # None: stderr
    level_source: str = "default"  # TF_LOG_LEVEL, LOGGER_LEVEL or VCUDA_LOG_LEVEL


@dataclass(frozen=True)
class LimiterConfig:
    devices: tuple[DeviceSetting, ...]
    pod: PodIdentity
    process: ProcessSettings
    log: LogSettings
    # One line each, "NAME=VALUE: ..." or "NAME: ...": values ignored or doubtful, which the
    # library logs as warnings.
    warnings: tuple[str, ...]


@cache
def _native() -> tuple[Any, Any]:
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(_CDEF)
    return ffi, ffi.dlopen(str(library_path()))


def describe_json() -> str:
    """The library's JSON document for the current environment:
    ``{"ok": true, "devices": [...], "pod": {...}, "log": {...}}`` or
    ``{"ok": false, "error": "..."}``."""
    ffi, lib = _native()
    size = 4096
    while True:
        buffer = ffi.new("char[]", size)
        needed = int(lib.vgpu_limiter_describe_config(buffer, size))
        if needed < size:
            # Paths and names are bytes in C: decode them as os.fsdecode would.
            return bytes(ffi.buffer(buffer, needed)).decode("utf-8", "surrogateescape")
        # The environment may grow between the two calls: ask again with what it said.
        size = needed + 1


def _optional_path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def load_config() -> LimiterConfig:
    """The configuration the library would enforce; ConfigError when it would refuse it."""
    document = json.loads(describe_json())
    if not document["ok"]:
        raise ConfigError(document["error"])
    pod = document["pod"]
    process = document["process"]
    log = document["log"]
    return LimiterConfig(
        devices=tuple(DeviceSetting(**device) for device in document["devices"]),
        pod=PodIdentity(
            source=pod["source"],
            folder=_optional_path(pod["folder"]),
            region_file=_optional_path(pod["region_file"]),
            namespace=pod["namespace"],
            name=pod["name"],
            container=pod["container"],
            base=Path(pod["base"]),
            base_source=pod["base_source"],
            name_source=pod["name_source"],
            uid=pod["uid"],
            container_source=pod["container_source"],
            region_required=pod["region_required"],
        ),
        process=ProcessSettings(
            **process | {"tmp_folder": Path(process["tmp_folder"])},
        ),
        log=LogSettings(
            level=log["level"],
            path=_optional_path(log["path"]),
            level_source=log["level_source"],
        ),
        warnings=tuple(document["warnings"]),
    )


@cache
def default_base() -> Path:
    """The library's default base folder of the pod regions (defined once, in config.h)."""
    return Path(json.loads(describe_json())["default_base"])


def environment_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables of `environ` (default: this process's) that the configuration reads."""
    environ = os.environ if environ is None else environ
    return sorted(name for name in environ if name in _FIXED or name.startswith(_PREFIXES))


_FIXED = frozenset(
    (
        "TENSOR_FUSION_CUDA_MEM_LIMIT",
        "TENSOR_FUSION_CUDA_UP_LIMIT",
        "TENSOR_FUSION_CUDA_SOFT_LIMIT",
        "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT",
        "SHM_PATH",
        "SHM_BASE_PATH",
        "POD_NAME",
        "POD_NAMESPACE",
        "CONTAINER_NAME",
        "TF_CUDA_CONTEXT_OVERHEAD",
        "TF_CUDA_LIB_PATH",
        "TF_NVML_LIB_PATH",
        "TMPDIR",
        "CUDA_VISIBLE_DEVICES",
        "TF_LOG_LEVEL",
        "TF_LOG_PATH",
        "TF_REGION_REQUIRED",
        "TF_REGION_WAIT",
        # Other systems' variables (config_seeds.c, config_pod.c, config_process.c).
        "CUDA_MEM_LIMIT",
        "CUDA_MEM_RATIO",
        "CUDA_CORE_LIMIT",
        "CUDA_CORE_SOFT_LIMIT",
        "CUDA_MEMORY_OVERSUBSCRIBE",
        "CUDA_MEM_OVERSOLD",
        "GPU_DEVICES_UUID",
        "VGPU_POD_NAME",
        "VGPU_POD_NAMESPACE",
        "VGPU_POD_UID",
        "VGPU_CONTAINER_NAME",
        "LOGGER_LEVEL",
        "VCUDA_MEMORY_LIMIT",
        "VCUDA_LOG_LEVEL",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "GPU_CORE_UTILIZATION_POLICY",
        "TF_SHM_FILE",
        # Recognised and warned about (config_foreign.c).
        "HYPERVISOR_IP",
        "HYPERVISOR_PORT",
        "ENABLE_NVML_HOOKS",
        "ENABLE_CUDA_HOOKS",
        "TF_SKIP_HOOKS_IF_NO_LIMIT",
        "TF_VISIBLE_DEVICES",
    )
)
_PREFIXES = (
    "CUDA_DEVICE_MEMORY_LIMIT_",
    "CUDA_DEVICE_SM_LIMIT_",
    "CUDA_MEM_LIMIT_",
    "CUDA_MEM_RATIO_",
    "CUDA_CORE_LIMIT_",
    "CUDA_CORE_SOFT_LIMIT_",
    "CUDA_MEM_OVERSOLD_",
)
