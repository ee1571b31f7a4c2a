"""The API server as the driver uses it, through lightkube's generic resources (its bundled
models may predate resource.k8s.io/v1): ResourceClaims and pods read for Prepare, the node's
ResourceSlice written. Synchronous: the kubelet's gRPC calls come on their own threads.
"""

from collections.abc import Callable, Mapping
from typing import Any, Final

import httpx2
from lightkube import ApiError, Client
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.core_v1 import Pod

from vgpu_hypervisor.dra.claims import ClaimError
from vgpu_hypervisor.kubernetes.kubeconfig import KubeConfigError, load
from vgpu_hypervisor.kubernetes.model import KubePod
from vgpu_hypervisor.kubernetes.pod_source import kube_pod

GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
ResourceClaim = create_namespaced_resource(GROUP, VERSION, "ResourceClaim", "resourceclaims")
ResourceSlice = create_global_resource(GROUP, VERSION, "ResourceSlice", "resourceslices")
FIELD_MANAGER: Final = "tf-hypervisor"


class KubeError(Exception):
    """The API server cannot be used as asked; one line."""


def open_client(kubeconfig: str | None) -> Client:
    """A client from ``kubeconfig``, else the pod's service account, else ~/.kube/config."""
    try:
        return Client(load(kubeconfig), field_manager=FIELD_MANAGER)
    except (KubeConfigError, ConfigError, OSError, ValueError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        raise KubeError(f"cannot read the Kubernetes config: {message}") from None


def api_error(error: ApiError) -> str:
    status = error.status
    return f"{status.code} {status.reason}: {status.message}"


class ApiClaims:
    """The ClaimSource of Prepare (prepare.py), through ``client``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return dict(_read(f"claim {namespace}/{name}", self._client.get, ResourceClaim, name,
                          namespace))  # fmt: skip

    def pod(self, namespace: str, name: str) -> KubePod:
        return kube_pod(_read(f"pod {namespace}/{name}", self._client.get, Pod, name, namespace))


def _read(what: str, get: Callable[..., Any], kind: Any, name: str, namespace: str) -> Any:
    try:
        return get(kind, name, namespace=namespace)
    except ApiError as error:
        raise ClaimError(f"cannot read {what}: {api_error(error)}") from None
    except httpx2.HTTPError as error:
        raise ClaimError(f"cannot read {what}: {error}") from None
