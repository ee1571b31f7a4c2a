"""Which driver entry points the limiter intercepts, against what a driver offers.

A driver hands out an entry point two ways: as an exported symbol (linking, dlsym) and through
cuGetProcAddress, which takes a base name ("cuMemAlloc") and returns whichever variant suits the
caller's CUDA version and stream flags ("cuMemAlloc_v2", "…_ptsz"). Every variant of a base is
therefore reachable, and for the families that carry a limit (allocation, free, launch, graph,
memory info, context, capture) each one must be one of the limiter's wrappers, or a newer
driver's new variant leaks the limit.
"""

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from vgpu_limiter.elf_symbols import exported_functions

# cuGetProcAddress variants: a version, then per-thread default stream forms.
_VARIANT = re.compile(r"^(?P<base>\w+?)(?P<suffix>(?:_v\d+)?(?:_ptds|_ptsz)?)$")
_CUDA_NAME = re.compile(r"^cu[A-Z]\w*$")
_NVML_NAME = re.compile(r"^nvml[A-Z]\w*$")

# Base names of the families whose every entry point the limiter must handle. Host-memory
# calls (cuMemAllocHost, cuMemFreeHost, cuMemHostAlloc) take no device memory; cuLaunchHostFunc
# runs host code: neither carries a limit.
FAMILIES: dict[str, re.Pattern[str]] = {
    "allocation": re.compile(
        r"^(cuMemAlloc(?!Host)\w*|cuMemCreate|cuMemMap|cuArrayCreate|cuArray3DCreate"
        r"|cuMipmappedArrayCreate)$"
    ),
    "free": re.compile(
        r"^(cuMemFree(?!Host)\w*|cuMemRelease|cuMemUnmap|cuArrayDestroy|cuMipmappedArrayDestroy"
        r"|cuMemPoolTrimTo|cuMemPoolDestroy)$"
    ),
    "launch": re.compile(r"^cuLaunch(?!HostFunc)\w*$"),
    "graph": re.compile(
        r"^(cuGraphLaunch|cuGraphInstantiate\w*|cuGraphExecDestroy|cuDeviceGraphMemTrim)$"
    ),
    "memory info": re.compile(r"^(cuMemGetInfo|cuDeviceTotalMem|nvmlDeviceGetMemoryInfo)$"),
    # A capture the limiter does not see would let it pace launches that only go into a graph.
    "capture": re.compile(r"^(cuStreamBeginCapture\w*|cuStreamEndCapture)$"),
    "context": re.compile(
        r"^(cuCtxCreate|cuCtxDestroy|cuDevicePrimaryCtx(Retain|Release|Reset)|cuGreenCtx(Create|Destroy)"
        r"|cuCtxSetLimit)$"
    ),
}


def base_name(symbol: str) -> str:
    """cuMemAllocAsync_ptsz → cuMemAllocAsync; cuMemcpy2DAsync_v2_ptds → cuMemcpy2DAsync."""
    match = _VARIANT.match(symbol)
    return match.group("base") if match else symbol


def family_of(base: str) -> str | None:
    return next((name for name, pattern in FAMILIES.items() if pattern.match(base)), None)


@dataclass
class EntryPoint:
    """One base name and the variants of it the library exports."""

    base: str
    family: str | None
    handled: list[str] = field(default_factory=list)
    unhandled: list[str] = field(default_factory=list)


@dataclass
class LibraryReport:
    api: str  # "cuda" or "nvml"
    library: Path
    entry_points: list[EntryPoint]

    @property
    def exported(self) -> int:
        return sum(len(e.handled) + len(e.unhandled) for e in self.entry_points)

    @property
    def gaps(self) -> list[EntryPoint]:
        """Entry points of a limit-carrying family with a variant the limiter misses."""
        return [e for e in self.entry_points if e.family is not None and e.unhandled]

    def to_json(self) -> dict[str, object]:
        return {
            "library": str(self.library),
            "exported": self.exported,
            "handled": sum(len(e.handled) for e in self.entry_points),
            "entry_points": {
                e.base: {"family": e.family, "handled": e.handled, "unhandled": e.unhandled}
                for e in self.entry_points
            },
            "gaps": [symbol for e in self.gaps for symbol in e.unhandled],
        }


def compare(api: str, library: Path, hooks: set[str]) -> LibraryReport:
    """The library's exported entry points (cu* or nvml*), grouped by base, against the hooks."""
    pattern = _CUDA_NAME if api == "cuda" else _NVML_NAME
    groups: dict[str, EntryPoint] = {}
    for symbol in sorted(exported_functions(library)):
        if not pattern.match(symbol):
            continue
        base = base_name(symbol)
        entry = groups.setdefault(base, EntryPoint(base, family_of(base)))
        (entry.handled if symbol in hooks else entry.unhandled).append(symbol)
    return LibraryReport(api, library, sorted(groups.values(), key=lambda e: e.base))


def default_library(variable: str, soname: str) -> Path | None:
    """Where the limiter would load the library from: the TF_*_LIB_PATH variable if set, else
    the dynamic linker's cache entry for the soname (this machine's architecture)."""
    configured = os.environ.get(variable)
    if configured:
        return Path(configured)
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if Path(p).is_file()), None
    )
    if ldconfig is None:
        return None
    listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False).stdout
    machine = os.uname().machine
    arch = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(machine, machine)
    for line in listing.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name == soname and arch in rest and "=>" in rest:
            return Path(rest.rsplit("=>", 1)[1].strip())
    return None
