"""The kinds the API server serves: one row of the table per resource.

A kind is served with every verb (create, get, list, watch, update, patch, delete,
deletecollection), a ``status`` subresource where it has one, discovery and its OpenAPI
document. Objects are checked against Kubernetes' published schema of the server's version
(kubernetes-validate). To serve another kind, register a :class:`Kind`:

    server.register(Kind("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"))

What a kind does beyond storing (defaults, immutable fields, how its deletion waits) is in
the optional hooks; the pod's are below.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Object = dict[str, Any]


class Invalid(ValueError):
    """An object the kind refuses (HTTP 422), with the field and why."""


@dataclass(frozen=True)
class Kind:
    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    status: bool = False  # has a status subresource: the object's PUT/PATCH keep status as is
    # Fields beyond metadata.name and metadata.namespace that a fieldSelector may name.
    selectable: tuple[str, ...] = ()
    # Deleting waits (deletionTimestamp set) where this says how long, in seconds; None: gone
    # at once. Finalizers hold any object until they are removed.
    grace: Callable[[Object, int | None], int | None] | None = None
    defaults: Callable[[Object], None] | None = None
    # Called with (old, new) on an update: raises Invalid for a change the kind forbids.
    check_update: Callable[[Object, Object], None] | None = None
    categories: tuple[str, ...] = field(default=())

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


# Pods


def _pod_defaults(pod: Object) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("resources", {})
        for amounts in (container["resources"].get(k, {}) for k in ("limits", "requests")):
            for name, amount in amounts.items():
                if isinstance(amount, int | float) and not isinstance(amount, bool):
                    amounts[name] = str(amount)  # a quantity is stored as a string
        limits = container["resources"].get("limits")
        if limits and "requests" not in container["resources"]:
            container["resources"]["requests"] = dict(limits)  # requests default to limits
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", _qos_class(spec.get("containers", [])))


def _qos_class(containers: list[Object]) -> str:
    """Guaranteed, Burstable or BestEffort, from the containers' cpu and memory."""
    asked = [c.get("resources", {}) for c in containers]
    if not any(
        r.get(k, {}).get(n)
        for r in asked
        for k in ("requests", "limits")
        for n in ("cpu", "memory")
    ):
        return "BestEffort"
    guaranteed = all(
        r.get("limits", {}).get(n) and r.get("requests", {}).get(n) == r["limits"][n]
        for r in asked
        for n in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def _pod_spec_frozen(spec: Object) -> Object:
    frozen = copy.deepcopy(spec)
    for name in _POD_MUTABLE:
        frozen.pop(name, None)
    for group in ("containers", "initContainers", "ephemeralContainers"):
        for container in frozen.get(group, []):
            container.pop("image", None)
    return frozen


def _pod_update(old: Object, new: Object) -> None:
    if _pod_spec_frozen(old.get("spec", {})) != _pod_spec_frozen(new.get("spec", {})):
        raise Invalid(
            "spec: Forbidden: pod updates may not change fields other than "
            "`spec.containers[*].image`, `spec.initContainers[*].image`, "
            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
            "tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it "
            "was previously negative)"
        )


def _pod_grace(pod: Object, asked: int | None) -> int | None:
    """A pod no node runs goes at once; one bound to a node waits for its kubelet."""
    if not pod.get("spec", {}).get("nodeName"):
        return None
    if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
        return None
    grace = asked if asked is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
    return None if grace == 0 else int(grace)


POD = Kind(
    "",
    "v1",
    "Pod",
    "pods",
    short_names=("po",),
    status=True,
    selectable=(
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    grace=_pod_grace,
    defaults=_pod_defaults,
    check_update=_pod_update,
    categories=("all",),
)


def _namespace_defaults(namespace: Object) -> None:
    namespace.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    namespace.setdefault("status", {}).setdefault("phase", "Active")
    labels = namespace["metadata"].setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = namespace["metadata"]["name"]


NAMESPACE = Kind(
    "",
    "v1",
    "Namespace",
    "namespaces",
    namespaced=False,
    short_names=("ns",),
    status=True,
    selectable=("status.phase",),
    defaults=_namespace_defaults,
)

EVENT = Kind(
    "",
    "v1",
    "Event",
    "events",
    short_names=("ev",),
    selectable=(
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
)


def _node_defaults(node: Object) -> None:
    labels = node["metadata"].setdefault("labels", {})
    labels.setdefault("kubernetes.io/hostname", node["metadata"]["name"])


def drop_device_taints(resource_slice: Object) -> None:
    """What an API server without the DRADeviceTaints feature gate does to a ResourceSlice it
    stores (its strategy's dropDisabledFields): the devices' taints are dropped, silently."""
    for device in resource_slice.get("spec", {}).get("devices") or []:
        if isinstance(device, dict):
            device.pop("taints", None)


BUILTIN: tuple[Kind, ...] = (
    NAMESPACE,
    POD,
    EVENT,
    Kind(
        "",
        "v1",
        "Node",
        "nodes",
        namespaced=False,
        short_names=("no",),
        status=True,
        selectable=("spec.unschedulable",),
        defaults=_node_defaults,
    ),
    Kind("", "v1", "ConfigMap", "configmaps", short_names=("cm",)),
    Kind("", "v1", "Secret", "secrets"),
    Kind("", "v1", "ServiceAccount", "serviceaccounts", short_names=("sa",)),
    Kind("", "v1", "Service", "services", short_names=("svc",), status=True),
    Kind("events.k8s.io", "v1", "Event", "events", short_names=("ev",)),
    # What a deployment applies (deploy/kubernetes).
    Kind("apps", "v1", "DaemonSet", "daemonsets", short_names=("ds",), status=True),
    Kind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False),
    Kind(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        namespaced=False,
    ),
    Kind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", short_names=("netpol",)),
    Kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        namespaced=False,
        status=True,
    ),
    Kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        namespaced=False,
    ),
    # Dynamic resource allocation, served for a DRA driver's tests.
    Kind("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", namespaced=False),
    Kind("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", status=True),
    Kind("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"),
    Kind(
        "resource.k8s.io",
        "v1",
        "ResourceSlice",
        "resourceslices",
        namespaced=False,
        selectable=("spec.nodeName", "spec.driver"),
    ),
)
