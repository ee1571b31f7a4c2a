"""What the daemon learns about a worker (a process in a pod's region) beyond its slot: its pid
in the daemon's namespace, its command line and start time, and its GPU utilization from NVML.

Containers run workers in pid namespaces of their own; the slot holds the pid as the worker
sees it and the inode of its namespace. The daemon finds the matching host pid in /proc (the
last NSpid of a process in that namespace) and records it in the slot, which lets the region's
liveness check and NVML's per-process figures (keyed by host pid) reach the worker.
"""

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from vgpu_limiter.region import ProcessInfo, own_pid_namespace

from vgpu_hypervisor.gpu import NOT_AVAILABLE, NodeSnapshot

_RETRY_S = 5.0  # a worker whose host pid was not found is looked for again after this
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _pid_namespace(pid: int) -> int:
    try:
        return Path(f"/proc/{pid}/ns/pid").stat().st_ino
    except OSError:
        return 0


def _ns_pids(pid: int) -> list[int]:
    """The NSpid line of /proc/<pid>/status: the pid in each namespace, innermost last."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(value) for value in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


@dataclass
class HostPids:
    """Finds the host pid of workers; remembers failures for a while (a /proc walk is not free)."""

    _missed: dict[tuple[int, int, int], float] = field(default_factory=dict)

    def find(self, process: ProcessInfo) -> int | None:
        if process.host_pid > 0:
            return process.host_pid
        if process.pid_namespace == own_pid_namespace():
            return process.pid
        identity = (process.pid, process.pid_namespace, process.start_time)
        now = time.monotonic()
        if now - self._missed.get(identity, -_RETRY_S) < _RETRY_S:
            return None
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            candidate = int(entry.name)
            pids = _ns_pids(candidate)
            if (
                pids
                and pids[-1] == process.pid
                and _pid_namespace(candidate) == (process.pid_namespace)
            ):
                self._missed.pop(identity, None)
                return candidate
        self._missed[identity] = now
        return None

    def forget_except(self, identities: set[tuple[int, int, int]]) -> None:
        for identity in set(self._missed) - identities:
            del self._missed[identity]


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    command: str | None
    started: float | None  # Unix seconds


@dataclass
class ProcessTable:
    """Command line and start time of host pids, cached while the process lives."""

    _cache: dict[tuple[int, int], ProcessFacts] = field(default_factory=dict)

    def facts(self, host_pid: int | None, start_ticks: int) -> ProcessFacts:
        started = psutil.boot_time() + start_ticks / _CLOCK_TICKS if start_ticks else None
        if host_pid is None:
            return ProcessFacts(None, started)
        key = (host_pid, start_ticks)
        cached = self._cache.get(key)
        if cached is None:
            try:
                command = " ".join(psutil.Process(host_pid).cmdline()) or None
            except (psutil.Error, OSError):
                command = None
            cached = ProcessFacts(command, started)
            if command is not None:
                self._cache[key] = cached
        return cached

    def forget_except(self, keys: set[tuple[int, int]]) -> None:
        for key in set(self._cache) - keys:
            del self._cache[key]


@dataclass
class Utilization:
    """Per (GPU UUID, host pid) the newest SM utilization sample. NVML lists only processes
    that ran since the last pass, so a process unheard of for ``hold_s`` counts as idle (0)."""

    hold_s: float = 3.0
    _samples: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    _reporting: set[str] = field(default_factory=set)

    def update(self, snapshot: NodeSnapshot) -> None:
        now = time.monotonic()
        self._reporting.clear()
        for device in snapshot.devices:
            if not isinstance(device.uuid, str) or device.process_utilization is NOT_AVAILABLE:
                continue
            uuid = device.uuid.lower()
            self._reporting.add(uuid)
            for sample in device.process_utilization:
                if isinstance(sample.sm_utilization, int):
                    self._samples[(uuid, sample.pid)] = (sample.sm_utilization, now)
        for key, (_, seen) in list(self._samples.items()):
            if now - seen > self.hold_s:
                del self._samples[key]

    def reports(self, uuid: str) -> bool:
        """Whether NVML gave process utilization for this GPU in the last pass."""
        return uuid.lower() in self._reporting

    def of(self, uuid: str, host_pid: int | None) -> int | None:
        """Percent, or None where NVML does not report it (or the pid is unknown)."""
        uuid = uuid.lower()
        if host_pid is None or uuid not in self._reporting:
            return None
        sample = self._samples.get((uuid, host_pid))
        return sample[0] if sample else 0
