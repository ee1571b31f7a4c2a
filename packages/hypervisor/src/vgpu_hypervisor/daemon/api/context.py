"""What the API's routers need from the daemon, and the readiness checks they report."""

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vgpu_limiter.region import REGION_SIZE

from vgpu_hypervisor.daemon.api.auth import Access
from vgpu_hypervisor.daemon.api.token_review import TokenReviewer
from vgpu_hypervisor.daemon.node import Node
from vgpu_hypervisor.gpu import BackendInfo

API = "/api/v1"


@dataclass
class ApiContext:
    """What the API needs from the daemon."""

    node: Node
    backend: BackendInfo
    token: str
    version: str
    shm_base_path: Path
    started: float
    # The daemon's tasks are running (readiness); set by the daemon.
    running: Callable[[], bool] = lambda: True
    # Cluster tokens accepted through TokenReview (--token-review); None: the token file only.
    reviewer: TokenReviewer | None = None
    # Why the pods cannot be followed from the API server now (Kubernetes on), None while they
    # can; this getter is None without Kubernetes.
    cluster_problem: Callable[[], str | None] | None = None
    # The read areas open without a token (the api_open_reads setting; auth.READ_AREAS).
    open_reads: frozenset[str] = frozenset()
    # Who may read and change what: made from the three above, one for every router.
    access: Access = field(init=False)

    def __post_init__(self) -> None:
        self.access = Access(self.token, self.reviewer, self.open_reads)


def readiness(context: ApiContext) -> dict[str, str]:
    """Per check "ok" or the problem."""
    view = context.node.view
    checks: dict[str, str] = {}
    snapshot = view.snapshot
    if snapshot is None:
        checks["nvml"] = "no GPU sample yet"
    elif snapshot.devices and all(not isinstance(d.uuid, str) for d in snapshot.devices):
        checks["nvml"] = "NVML gave no device"
    else:
        checks["nvml"] = "ok"
    base = context.shm_base_path
    checks["shm_base_path"] = (
        "ok" if os.access(base, os.W_OK | os.X_OK) else f"{base} is not writable"
    )
    checks["free_space"] = free_space_problem(base) or "ok"
    checks["tasks"] = "ok" if context.running() else "a daemon task is restarting"
    if context.cluster_problem is not None:
        checks["kubernetes"] = context.cluster_problem() or "ok"
    return checks


def free_space_problem(base: Path) -> str | None:
    """Whether a new pod's region would fit on the base path's filesystem (a full disk makes
    pod creation fail; the region files' space is allocated for real, never sparse)."""
    try:
        info = os.statvfs(base)
    except OSError as error:
        return f"{base}: {error.strerror}"
    free = info.f_bavail * info.f_frsize
    if free < REGION_SIZE:
        return f"{base}: {free} bytes free, less than one pod region ({REGION_SIZE} bytes)"
    return None
