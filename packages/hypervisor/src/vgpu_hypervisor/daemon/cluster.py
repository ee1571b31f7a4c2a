"""What the node's view asks of the cluster the daemon follows (Kubernetes, when it does): the
pod a host process belongs to, and a pod's phase.

The core only states the question; the one place that wires Kubernetes in (service.py) hands
the node an answer (kubernetes/identity.py reads it from cgroups and the pod source's cache),
so nothing in the core imports Kubernetes and a bare-metal daemon loads none of it."""

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class PodOfProcess:
    namespace: str
    pod: str
    container: str | None


class ClusterPods(Protocol):
    """The cluster's pods of this node, as the node's view needs them."""

    def pod_of(self, pid: int) -> PodOfProcess | None:
        """The pod (and container, when known) of host process ``pid``; None for none."""
        ...

    def phase(self, namespace: str, name: str) -> str | None:
        """The phase of the pod ``namespace/name`` (Pending, Running...); None when unknown."""
        ...
