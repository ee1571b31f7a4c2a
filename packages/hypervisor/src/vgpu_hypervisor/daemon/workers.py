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


Identity = tuple[int, int, int]  # (pid, pid namespace inode, start time) of a slot


def _identity(process: ProcessInfo) -> Identity:
    return (process.pid, process.pid_namespace, process.start_time)


@dataclass
class HostPids:
    """Host pids of workers. Workers of the daemon's own pid namespace need no search; the
    others are looked up in one /proc walk per pass at most, and one not found is looked for
    again after a while (a walk reads every process's status)."""

    _found: dict[Identity, int] = field(default_factory=dict)
    _missed: dict[Identity, float] = field(default_factory=dict)

    def lookup(self, process: ProcessInfo) -> int | None:
        """The host pid if known, without searching."""
        if process.host_pid > 0:
            return process.host_pid
        if process.pid_namespace == own_pid_namespace():
            return process.pid
        return self._found.get(_identity(process))

    def resolve(self, processes: list[ProcessInfo]) -> dict[Identity, int]:
        """Host pids of ``processes`` whose slot has none yet (searching when due)."""
        now = time.monotonic()
        wanted = [
            p
            for p in processes
            if self.lookup(p) is None
            and now - self._missed.get(_identity(p), -_RETRY_S) >= _RETRY_S
        ]
        if wanted:
            namespaces = {p.pid_namespace for p in wanted}
            table = _walk_proc(namespaces)
            for process in wanted:
                host_pid = table.get((process.pid_namespace, process.pid))
                if host_pid is None:
                    self._missed[_identity(process)] = now
                else:
                    self._found[_identity(process)] = host_pid
                    self._missed.pop(_identity(process), None)
        return {_identity(p): pid for p in processes if p.host_pid <= 0 and (pid := self.lookup(p))}

    def forget_except(self, identities: set[Identity]) -> None:
        for table in (self._found, self._missed):
            for identity in set(table) - identities:
                del table[identity]


def _walk_proc(namespaces: set[int]) -> dict[tuple[int, int], int]:
    """(pid namespace inode, pid inside it) → host pid, for processes of those namespaces."""
    table: dict[tuple[int, int], int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        host_pid = int(entry.name)
        namespace = _pid_namespace(host_pid)
        if namespace in namespaces:
            pids = _ns_pids(host_pid)
            if pids:
                table[(namespace, pids[-1])] = host_pid
    return table


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
