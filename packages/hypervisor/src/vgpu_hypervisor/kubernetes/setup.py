"""Whether the daemon follows Kubernetes, and the client and pod source it does it with.

The client library and the pod source are imported only when the daemon follows Kubernetes: a
bare-metal daemon neither needs nor loads them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vgpu_common.limits import parse_percent

from vgpu_hypervisor.kubernetes.annotations import NodeGpu, ResourceNames
from vgpu_hypervisor.settings import Settings

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from vgpu_hypervisor.daemon.node import Node
    from vgpu_hypervisor.kubernetes.pod_source import PodSource


class KubernetesSetupError(Exception):
    """The daemon cannot follow Kubernetes as asked; one line."""


def enabled(settings: Settings, environ: Mapping[str, str] = os.environ) -> bool:
    """--kubernetes, else on when the daemon runs in a cluster (as a pod)."""
    if settings.kubernetes is not None:
        return settings.kubernetes
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))


def open_client(settings: Settings) -> AsyncClient:
    """A client from --kubeconfig, else the pod's service account, else ~/.kube/config."""
    from lightkube import AsyncClient
    from lightkube.core.exceptions import ConfigError

    from vgpu_hypervisor.kubernetes.kubeconfig import KubeConfigError, load

    try:
        return AsyncClient(load(settings.kubeconfig), field_manager="tf-hypervisor")
    except (KubeConfigError, ConfigError, OSError, ValueError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        raise KubernetesSetupError(f"cannot read the Kubernetes config: {message}") from None


def resource_names(settings: Settings) -> ResourceNames:
    """The resources and their defaults as the settings give them (pod source and plugin)."""
    compute = settings.default_gpu_compute
    return ResourceNames(
        settings.gpu_resource,
        settings.gpu_memory_resource,
        settings.gpu_compute_resource,
        memory_unit=settings.gpu_memory_unit,
        default_memory=settings.default_gpu_memory,
        default_compute=None if compute is None else parse_percent(compute),
    )


def node_gpus(node: Node) -> list[NodeGpu]:
    """The node's GPUs as the last NVML pass saw them."""
    return [
        NodeGpu(gpu.index, gpu.uuid, gpu.name or "", gpu.memory_total)
        for gpu in node.view.gpus
        if gpu.uuid is not None
    ]


def pod_source(settings: Settings, node: Node) -> PodSource:
    """The pod source of this node, its client from the settings; KubernetesSetupError."""
    from vgpu_hypervisor.daemon.refusals import RefusalLog, RefusalReporter
    from vgpu_hypervisor.kubernetes.events import EventPoster
    from vgpu_hypervisor.kubernetes.pod_book import BookError, PodBook
    from vgpu_hypervisor.kubernetes.pod_source import Backoff, PodSource
    from vgpu_hypervisor.kubernetes.refusals import KubernetesRefusals

    if not settings.node_name:
        raise KubernetesSetupError(
            "Kubernetes is on but NODE_NAME is not set (--node-name or NODE_NAME: the "
            "DaemonSet sets it from spec.nodeName)"
        )
    try:
        book = PodBook(node.store.base)
    except BookError as error:
        raise KubernetesSetupError(str(error)) from None
    client = open_client(settings)
    names = resource_names(settings)
    events = EventPoster(client, settings.node_name, asyncio.get_running_loop())
    source = PodSource(
        client,
        settings.node_name,
        node.store,
        lambda: node_gpus(node),
        names=names,
        events=events,
        changed=node.refresh,
        backoff=Backoff(
            first=min(0.5, settings.kube_backoff_max_s), most=settings.kube_backoff_max_s
        ),
        book=book,
        tenant_raise=settings.tenant_raise,
        plugin_places=settings.device_plugin,
        dra_places=settings.dra,
    )
    node.watchers.append(RefusalReporter(KubernetesRefusals(source, events, RefusalLog())).observe)
    return source
