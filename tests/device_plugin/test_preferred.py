"""GetPreferredAllocation for a pod the pod source does not show (yet), over real gRPC: the
plugin waits a moment for it, then answers from the devices alone (one share on each of as many
GPUs as asked, by the placement rule), always within the kubelet's contract (a subset of the
available devices, with those it must include, of its size, or nothing), and no waiting call
holds the thread Allocate needs. Before, it answered nothing at once, and the kubelet's own pick
put two shares of one GPU in one container, or a pod on a GPU that could not hold it."""

import threading
import time
from collections.abc import Sequence

import grpc
import pytest
from vgpu_hypervisor.device_plugin.accounting import Placement
from vgpu_hypervisor.device_plugin.allocation import AllocationError
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.resources import gpu_of
from vgpu_hypervisor.device_plugin.server import PREFERRED_WAIT_S, DevicePlugin
from vgpu_hypervisor.device_plugin.serving import CONTROL
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_hypervisor.kubernetes.model import KubePod

from tests.device_plugin.conftest import (
    SHARES,
    GiB,
    Node,
    gpu_pod,
    kubelet_pod,
    serving,
    wait_bound,
)
from tests.device_plugin.test_accounting import admitted, capacity, uuids
from tests.hypervisor.conftest import wait_for

GPU = "vgpu.io/gpu"
SHORT_WAIT_S = 0.1  # where the wait is not what is tested


def shares(uuid: str) -> list[str]:
    return [f"{uuid}-{k}" for k in range(SHARES)]


def request_of(
    available: Sequence[str], must: Sequence[str] = (), size: int = 1
) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


def preferred(
    node: Node, available: Sequence[str], must: Sequence[str] = (), size: int = 1
) -> list[str]:
    """The plugin's answer to the kubelet's GetPreferredAllocation, checked against the
    kubelet's contract."""
    if not node.kubelet.plugins:
        node.kubelet.connect()
    answer = node.kubelet.plugins[GPU].GetPreferredAllocation(
        request_of(available, must, size), timeout=10
    )
    (one,) = answer.container_responses
    chosen = list(one.deviceIDs)
    if chosen:
        assert set(chosen) <= set(available) and set(must) <= set(chosen)
        assert len(set(chosen)) == len(chosen) == size
    return chosen


def test_a_pod_the_pod_source_does_not_show_gets_a_share_on_each_of_its_gpus(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """The pod source never shows the pod within the wait: one share on each GPU, so the
    pod is bound once the pod source shows it. (The kubelet's own pick, before, was two
    shares of the first GPU: refused at binding.)"""
    pod = gpu_pod("early", 2, "2026-01-01T00:00:00Z", memory=2, compute=10)
    node.kubelet.connect()
    started = time.monotonic()
    answer = node.kubelet.admit(kubelet_pod(pod))["main"]
    waited = time.monotonic() - started
    assert sorted(gpu_of(one) for one in node.kubelet.preferred[-1]) == sorted(uuids(snapshot))
    assert PREFERRED_WAIT_S <= waited < PREFERRED_WAIT_S + 5
    node.pods.append(pod)
    allocation = wait_bound(plugin, {"main": answer})["main"]
    assert allocation.pod == ("team", "early") and not allocation.refused
    assert allocation.gpus == sorted(uuids(snapshot))
    assert not node.events


def test_a_pod_that_shows_up_within_the_wait_is_placed_by_what_it_asks(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """The first GPU holds a big pod; the pod source shows the next pod a moment after the
    kubelet asks: it goes where its 16 GiB fit, the second GPU, by what it asks."""
    first, second = sorted(uuids(snapshot))
    units = capacity(snapshot) // GiB
    admitted(node, plugin, "big", 1, memory=units - 8, compute=50, choose=[f"{first}-0"])
    late = gpu_pod("late", 1, "2026-01-01T00:00:01Z", memory=16, compute=10)
    shows = threading.Timer(0.3, node.pods.append, [late])
    shows.start()
    try:
        answer = node.kubelet.admit(kubelet_pod(late))["main"]
    finally:
        shows.cancel()
        shows.join()
    assert node.kubelet.preferred[-1] == [f"{second}-0"]
    allocation = wait_bound(plugin, {"main": answer})["main"]
    assert allocation.gpus == [second] and not allocation.refused
    assert not node.events


@pytest.mark.parametrize("placement", ["binpack", "spread"])
def test_the_devices_alone_are_those_with_the_most_room(
    node: Node, snapshot: NodeSnapshot, placement: Placement
) -> None:
    """No pod known: the GPU with the most left whatever the policy (binpack's choice, the
    least left, is the likeliest not to hold the pod); a GPU's lowest-numbered free share."""
    first, second = sorted(uuids(snapshot))
    with serving(node, snapshot, placement, preferred_wait_s=SHORT_WAIT_S) as plugin:
        admitted(node, plugin, "small", 1, memory=2, compute=10, choose=[f"{first}-0"])
        free = shares(first)[1:] + shares(second)
        assert preferred(node, free) == [f"{second}-0"]
        assert sorted(preferred(node, free, size=2)) == [f"{first}-1", f"{second}-0"]


def test_after_a_wait_in_vain_the_next_calls_answer_at_once(
    node: Node, snapshot: NodeSnapshot
) -> None:
    """The kubelet asks once per container and admits pods one at a time: a pod source that is
    out costs one wait, not one per container. Once the hold is over, a call waits again."""
    first, second = sorted(uuids(snapshot))
    available = shares(first) + shares(second)
    with serving(node, snapshot, preferred_wait_s=1.0) as plugin:
        started = time.monotonic()
        assert len(preferred(node, available)) == 1
        assert time.monotonic() - started >= 1.0
        started = time.monotonic()
        assert len(preferred(node, available, size=2)) == 2
        assert time.monotonic() - started < 0.9
        plugin._gave_up_until = 0.0  # the hold over
        started = time.monotonic()
        preferred(node, available)
        assert time.monotonic() - started >= 1.0


def test_a_gpu_with_nothing_left_is_not_preferred(node: Node, snapshot: NodeSnapshot) -> None:
    first, second = sorted(uuids(snapshot))
    with serving(node, snapshot, preferred_wait_s=SHORT_WAIT_S) as plugin:
        admitted(node, plugin, "whole", 1, choose=[f"{first}-0"])  # charged the whole GPU
        free = shares(first)[1:] + shares(second)
        assert preferred(node, free) == [f"{second}-0"]
        assert preferred(node, free, size=2) == []  # one GPU has room: no answer keeps to it


def test_an_answer_from_the_devices_alone_keeps_to_the_kubelets_request(
    node: Node, snapshot: NodeSnapshot
) -> None:
    """The devices it must include (the kubelet reuses them) come first and their GPUs are
    not taken again; a request no answer of distinct GPUs meets gets none."""
    first, second = sorted(uuids(snapshot))
    every = shares(first) + shares(second)
    with serving(node, snapshot, preferred_wait_s=SHORT_WAIT_S):
        assert preferred(node, every, size=2) == [f"{first}-0", f"{second}-0"]
        assert preferred(node, every, [f"{second}-2"], size=2) == [f"{second}-2", f"{first}-0"]
        assert preferred(node, every, [f"{second}-2"], size=1) == [f"{second}-2"]
        assert preferred(node, [f"{second}-3"], size=1) == [f"{second}-3"]
        assert preferred(node, every, size=3) == []  # two GPUs
        assert preferred(node, shares(first), size=2) == []  # one GPU's shares
        assert preferred(node, every, shares(first)[:2], size=2) == []  # must: one GPU twice
        assert preferred(node, every, shares(first)[:1] + shares(second)[:1], size=1) == []


def test_a_pod_source_that_fails_gets_the_answer_from_the_devices_alone(
    node: Node, snapshot: NodeSnapshot
) -> None:
    def failing() -> list[KubePod]:
        raise AllocationError("the pods not listed yet")

    first, second = sorted(uuids(snapshot))
    with serving(node, snapshot, preferred_wait_s=SHORT_WAIT_S, pods=failing):
        every = shares(first) + shares(second)
        assert preferred(node, every, size=2) == [f"{first}-0", f"{second}-0"]


class Lookers:
    """The node's pods, as the pod source gives them, noting which thread looked when."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}

    def __call__(self) -> list[KubePod]:
        with self._lock:
            self._last[threading.current_thread().name] = time.monotonic()
        return self._node.pods

    def looking(self) -> int:
        """How many threads looked in the last half second."""
        now = time.monotonic()
        with self._lock:
            return sum(1 for at in self._last.values() if now - at < 0.5)


def test_waiting_calls_leave_a_thread_free_and_end_with_the_call_or_the_plugin(
    node: Node, snapshot: NodeSnapshot
) -> None:
    """With a wait far longer than the test: as many calls as may wait do, one more answers
    at once and the server's other calls are answered meanwhile; a call the kubelet cancels
    stops waiting, and stopping the plugin answers the others at once."""
    first, second = sorted(uuids(snapshot))
    every = shares(first) + shares(second)
    lookers = Lookers(node)
    with serving(node, snapshot, preferred_wait_s=600, pods=lookers) as plugin:
        node.kubelet.connect()
        stub = node.kubelet.plugins[GPU]
        waiting = [
            stub.GetPreferredAllocation.future(request_of(every), timeout=120)
            for _ in range(CONTROL - 1)
        ]
        wait_for(lambda: lookers.looking() == CONTROL - 1)
        started = time.monotonic()
        assert preferred(node, every) == [f"{first}-0"]
        assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5).pre_start_required is False
        assert time.monotonic() - started < 3
        assert not any(call.done() for call in waiting)

        waiting[0].cancel()  # type: ignore[no-untyped-call]  # untyped in grpc-stubs
        wait_for(lambda: lookers.looking() == CONTROL - 2)
        with pytest.raises(grpc.FutureCancelledError):
            waiting[0].result()

        started = time.monotonic()
        plugin.stop()
        for call in waiting[1:]:
            (one,) = call.result(timeout=10).container_responses
            assert list(one.deviceIDs) == [f"{first}-0"]
        assert time.monotonic() - started < 10
