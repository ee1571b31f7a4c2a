"""Which Kubernetes pod and container a host process belongs to, from ``/proc/PID/cgroup``.

The kubelet puts every container in a cgroup under its pod's, and the pod's cgroup carries the
pod UID. The forms seen on nodes (cgroup v1 lines ``N:controller:/path``, v2 ``0::/path``):

- cgroupfs driver: ``/kubepods/burstable/pod<UID>/<container id>`` (Guaranteed pods have no
  QoS level: ``/kubepods/pod<UID>/...``);
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID with _
  for ->.slice/<runtime>-<container id>.scope``, runtime ``cri-containerd``, ``crio`` or
  ``docker``;
- a container's own view may start at a nested root (``/../..``), which changes nothing here.

The container id is the 64 hex digits the runtime reports in ``containerStatuses[].containerID``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vgpu_hypervisor.daemon.cluster import PodOfProcess
from vgpu_hypervisor.kubernetes.model import KubePod

_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
_CONTAINER = re.compile(
    r"(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?"
)


@dataclass(frozen=True)
class CgroupIdentity:
    pod_uid: str
    container_id: str  # "" when the process sits in the pod's cgroup itself (the pause one)


def parse_cgroup(text: str) -> CgroupIdentity | None:
    """The pod (and container) named by the contents of a /proc/PID/cgroup, or None."""
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        if "kubepods" not in path:
            continue
        parts = [part for part in path.split("/") if part]
        for position, part in enumerate(parts):
            match = _POD.search(part)
            if match is None:
                continue
            uid = match[1].replace("_", "-")
            rest = parts[position + 1 : position + 2]
            container = _CONTAINER.fullmatch(rest[0]) if rest else None
            return CgroupIdentity(uid, container[1] if container else "")
    return None


def read_identity(pid: int, proc: Path = Path("/proc")) -> CgroupIdentity | None:
    try:
        return parse_cgroup((proc / str(pid) / "cgroup").read_text())
    except (OSError, UnicodeDecodeError):
        return None


class PodLookup(Protocol):
    """The Kubernetes pods of this node (the pod source's cache)."""

    def by_uid(self, uid: str) -> KubePod | None: ...

    def by_key(self, namespace: str, name: str) -> KubePod | None: ...


def pod_of(pid: int, pods: PodLookup, proc: Path = Path("/proc")) -> PodOfProcess | None:
    """The Kubernetes pod (and container, when its status names the id) of host ``pid``."""
    identity = read_identity(pid, proc)
    if identity is None:
        return None
    pod = pods.by_uid(identity.pod_uid)
    if pod is None:
        return None
    container = next(
        (
            c.name
            for c in pod.containers
            if identity.container_id and c.container_id == identity.container_id
        ),
        None,
    )
    return PodOfProcess(pod.namespace, pod.name, container)


@dataclass(frozen=True)
class CgroupPods:
    """The node's view's ClusterPods (daemon/cluster.py) in a cluster: a process's pod from its
    cgroup, looked up among ``pods`` (the pod source's cache)."""

    pods: PodLookup
    proc: Path = Path("/proc")

    def pod_of(self, pid: int) -> PodOfProcess | None:
        return pod_of(pid, self.pods, self.proc)

    def phase(self, namespace: str, name: str) -> str | None:
        pod = self.pods.by_key(namespace, name)
        return None if pod is None else pod.phase
