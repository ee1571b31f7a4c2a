"""What the node's view asks of the cluster the daemon follows (Kubernetes, when it does): the
pod a host process belongs to, and a pod's phase.

The core only states the question; the one place that wires Kubernetes in (service.py) hands
the node an answer (kubernetes/identity.py reads it from cgroups and the pod source's cache),
so nothing in the core imports Kubernetes and a bare-metal daemon loads none of it."""

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Charge:
    """What pods are charged on one GPU (or what one pod is): bytes of memory and hundredths
    of a percent of its time. The device plugin keeps them (device_plugin/accounting.py); the
    node's view shows each GPU's total."""

    memory: int
    compute: int

    def __add__(self, other: "Charge") -> "Charge":
        return Charge(self.memory + other.memory, self.compute + other.compute)

    def __sub__(self, other: "Charge") -> "Charge":
        return Charge(self.memory - other.memory, self.compute - other.compute)

    def holds(self, other: "Charge") -> bool:
        """Whether ``other`` fits in what this is (memory and compute both)."""
        return other.memory <= self.memory and other.compute <= self.compute


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
