"""A pod's effective request of the vgpu resources, as Kubernetes counts it.

The scheduler charges a pod, and the kubelet gives it devices, by its effective request
(upstream component-helpers' PodRequests): its containers' requests summed, or the most any
init container needs while it runs, whichever is larger, resource by resource. A sidecar (an
init container with restartPolicy Always) runs beside everything started after it: its
request adds to the containers' sum and to that of every init container after it. So an init
container or a sidecar asking for a vgpu share is charged and limited like any container.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence

from vgpu_common.limits import parse_quantity

from vgpu_hypervisor.kubernetes.model import KubeContainer

# Called with (container, resource, quantity text, why) for a quantity that cannot be read.
Problem = Callable[[KubeContainer, str, str, str], None]


def effective_requests(
    containers: Iterable[KubeContainer], resources: Sequence[str], problem: Problem
) -> dict[str, int]:
    """The pod's effective request of each of ``resources`` that one of ``containers`` (init
    containers among them, in spec order) asks for; a quantity that cannot be read counts as
    none, after ``problem`` is told."""
    running: dict[str, int] = {}  # the containers and sidecars: what runs at the end
    sidecars: dict[str, int] = {}  # the sidecars started so far
    init_peak: dict[str, int] = {}  # the most the init phase needs at one time
    for container in containers:
        asks = _asks(container, resources, problem)
        if not container.init:
            _add(running, asks)
            continue
        if container.sidecar:
            _add(running, asks)
            _add(sidecars, asks)
            during = dict(sidecars)
        else:
            during = dict(sidecars)
            _add(during, asks)
        _most(init_peak, during)
    _most(running, init_peak)
    return running


def _asks(container: KubeContainer, resources: Sequence[str], problem: Problem) -> dict[str, int]:
    asks: dict[str, int] = {}
    for resource in resources:
        text = container.resources.get(resource)
        if text is None:
            continue
        try:
            asks[resource] = parse_quantity(text)
        except ValueError as error:
            problem(container, resource, text, str(error))
    return asks


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for resource, value in more.items():
        into[resource] = into.get(resource, 0) + value


def _most(into: dict[str, int], other: Mapping[str, int]) -> None:
    for resource, value in other.items():
        into[resource] = max(into.get(resource, 0), value)
