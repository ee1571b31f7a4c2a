"""What the daemon keeps of a Kubernetes pod: the parts of its object that decide its limits.

The pod source fills these from the API server; the device plugin reads them to find the pod a
container being allocated belongs to. Plain data, no client types, so both sides stay apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class UserGroup:
    """A user id and a group id; None where not given."""

    user: int | None = None
    group: int | None = None


@dataclass(frozen=True)
class KubeContainer:
    name: str
    # resources.limits (and requests where limits lack a name), as the API server gives them.
    resources: Mapping[str, str] = field(default_factory=dict)
    # containerStatuses[].containerID without the runtime prefix; "" before it starts.
    container_id: str = ""
    running: bool = False
    # securityContext.runAsUser and runAsGroup of the container itself (None: not set there).
    run_as: UserGroup = UserGroup()
    # From spec.initContainers (they come first in a pod's containers, in spec order); a
    # sidecar is one with restartPolicy Always, which keeps running beside the others.
    init: bool = False
    sidecar: bool = False
    # resources.claims: the names of the pod's claims (spec.resourceClaims) it uses.
    claims: tuple[str, ...] = ()


@dataclass(frozen=True)
class KubePod:
    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    resource_version: str
    created: str  # metadata.creationTimestamp (RFC 3339), orders pending pods
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[KubeContainer, ...] = ()  # its init containers first, then the others
    deleting: bool = False  # metadata.deletionTimestamp is set
    # spec.securityContext: runAsUser and runAsGroup (the containers' unless they set their
    # own) and fsGroup (a supplementary group of every container's processes).
    run_as: UserGroup = UserGroup()
    fs_group: int | None = None
    # Its GPUs may come from DRA: it references ResourceClaims (spec.resourceClaims), or the
    # scheduler gave its extended resources through one (status.extendedResourceClaimStatus).
    dra_claims: bool = False
    # The ResourceClaim each of the pod's claims names: spec.resourceClaims' resourceClaimName,
    # else status.resourceClaimStatuses' (the claim made from a template for it).
    claim_objects: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
