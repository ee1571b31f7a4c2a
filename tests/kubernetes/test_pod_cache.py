"""The pod source in-process against the API-server emulator: its cache of the node's pods
(what the device plugin asks), GPUs the plugin assigns, and events that do not flood."""

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from lightkube import AsyncClient, KubeConfig
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodNotFound, PodStore
from vgpu_hypervisor.device_plugin.prepare import store_preparer
from vgpu_hypervisor.kubernetes.annotations import NodeGpu
from vgpu_hypervisor.kubernetes.events import EventPoster
from vgpu_hypervisor.kubernetes.model import UserGroup
from vgpu_hypervisor.kubernetes.pod_source import Backoff, PodSource

from tests.support.apiserver import ApiServer

UUIDS = ("GPU-00000000-1111-2222-3333-444444444444", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
GPUS = [NodeGpu(i, uuid, "NVIDIA H100 80GB HBM3") for i, uuid in enumerate(UUIDS)]
GiB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def until(condition: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def node_source(
    api: ApiServer,
    tmp_path: Path,
    store: PodStore,
    *,
    plugin_places: bool = False,
    dra_places: bool = False,
    gpus: Sequence[NodeGpu] = GPUS,
) -> PodSource:
    """The pod source of node-a on the emulator, with the node's ``gpus``."""
    client = AsyncClient(KubeConfig.from_file(api.kubeconfig(tmp_path / "kubeconfig")))
    return PodSource(
        client,
        "node-a",
        store,
        lambda: gpus,
        backoff=Backoff(0.1, 0.2),
        plugin_places=plugin_places,
        dra_places=dra_places,
    )


@asynccontextmanager
async def running(source: PodSource) -> AsyncIterator[PodSource]:
    """The pod source following the API server until left."""
    task = asyncio.create_task(source.run())
    try:
        yield source
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def has_region(store: PodStore, name: str) -> bool:
    try:
        store.get("default", name)
    except PodNotFound:
        return False
    return True


def test_pending_pods_assignment_and_rate_limited_events(api: ApiServer, tmp_path: Path) -> None:
    store = PodStore(tmp_path / "shm")
    clock = Clock()

    async def scenario() -> None:
        client = AsyncClient(KubeConfig.from_file(api.kubeconfig(tmp_path / "kubeconfig")))
        events = EventPoster(client, "node-a", asyncio.get_running_loop(), clock=clock)
        source = PodSource(
            client, "node-a", store, lambda: GPUS, events=events, backoff=Backoff(0.1, 0.2)
        )
        task = asyncio.create_task(source.run())
        try:
            api.put_pod("second", phase="Pending", resources={"vgpu.io/gpu": "1"})
            api.put_pod("first", phase="Pending", resources={"vgpu.io/gpu-memory": "1024"})
            api.put_pod("plain", phase="Pending")
            api.put_pod("running", resources={"vgpu.io/gpu": "1"})
            api.put_pod("other", node="node-b", phase="Pending", resources={"vgpu.io/gpu": "1"})
            await until(lambda: len(source.pods()) == 4)
            # Oldest first by creation time: "second" was created before "first".
            assert [pod.name for pod in source.pending()] == ["second", "first"]

            # Before the plugin assigns GPUs every GPU of the node carries the limits; after,
            # those given (an entry made before keeps its limits: a limit is never dropped).
            await until(lambda: has_region(store, "first") and has_region(store, "second"))
            record = store.get("default", "first")
            assert {d.uuid for d in record.devices} == set(UUIDS)
            second = source.by_key("default", "second")
            assert second is not None and source.by_uid(second.uid) == second
            await asyncio.to_thread(source.assign, second.uid, ["1"])
            api.put_pod("second", phase="Pending", resources={"vgpu.io/gpu": "1"},
                        annotations={"tensor-fusion.ai/vram-limit": "2Gi"})  # fmt: skip

            def limits() -> dict[str, int]:
                return {d.uuid: d.memory_limit for d in store.get("default", "second").devices}

            await until(lambda: limits() == {UUIDS[0]: 0, UUIDS[1]: 2 * GiB})

            # A bad pod: one event, not one per re-list, until the interval has passed.
            api.put_pod("bad", annotations={"tensor-fusion.ai/compute-limit": "300"})
            await until(lambda: len(api.events) == 1)
            api.expire()  # a fresh list sees the pod again
            api.put_pod("bump")
            await until(lambda: source.by_key("default", "bump") is not None)
            await events.drain()
            assert len(api.events) == 1
            clock.now += 61
            api.put_pod("bad", annotations={"tensor-fusion.ai/compute-limit": "300"})
            await until(lambda: len(api.events) == 2)
            assert "compute-limit='300'" in api.events[1]["message"]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    store.close()


def test_a_finished_pod_loses_its_region_and_a_restart_cleans_up(
    api: ApiServer, tmp_path: Path
) -> None:
    store = PodStore(tmp_path / "shm")
    vram = {"tensor-fusion.ai/vram-limit": "1Gi"}

    async def follow(until_true: object) -> None:
        client = AsyncClient(KubeConfig.from_file(api.kubeconfig(tmp_path / "kubeconfig")))
        source = PodSource(client, "node-a", store, lambda: GPUS, backoff=Backoff(0.1, 0.2))
        task = asyncio.create_task(source.run())
        try:
            await until(until_true)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    api.put_pod("job", annotations=vram)
    api.put_pod("gone-later", annotations=vram)
    asyncio.run(follow(lambda: has_region(store, "job") and has_region(store, "gone-later")))
    made = store.create("default", "manual", {})  # through the API: not the pod source's
    assert made.error is None

    # While no daemon follows: one pod finishes, one is deleted.
    api.put_pod("job", annotations=vram, phase="Succeeded")
    api.delete_pod("gone-later")
    asyncio.run(
        follow(lambda: not has_region(store, "job") and not has_region(store, "gone-later"))
    )
    assert has_region(store, "manual")
    store.close()


def test_a_cancellation_that_comes_with_a_pod_event_stops_the_pod_source(
    api: ApiServer, tmp_path: Path
) -> None:
    """The daemon stops by cancelling the pod source; a pod event that arrives as it does must
    not swallow the cancellation (Python 3.11's wait_for returned the event instead, and the
    daemon went on watching until its stop deadline)."""
    from lightkube.resources.core_v1 import Pod

    store = PodStore(tmp_path / "shm")
    api.put_pod("p")

    async def scenario() -> None:
        client = AsyncClient(KubeConfig.from_file(api.kubeconfig(tmp_path / "kubeconfig")))
        pod = await client.get(Pod, "p", namespace="default")
        watching, arrives = asyncio.Event(), asyncio.Event()

        async def watch(*_: object, **__: object) -> AsyncIterator[tuple[str, Pod]]:
            watching.set()
            await arrives.wait()
            yield "MODIFIED", pod
            await asyncio.Event().wait()  # nothing more

        source = PodSource(client, "node-a", store, lambda: GPUS, backoff=Backoff(0.1, 0.2))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(client, "watch", watch)
            task = asyncio.create_task(source.run())
            await asyncio.wait_for(watching.wait(), 10)
            arrives.set()  # the event and the cancellation in one turn of the loop
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=5)
        assert task in done and task.cancelled()

    asyncio.run(scenario())
    store.close()


def test_a_device_plugin_pod_with_a_claim_of_another_driver_has_its_region_followed(
    api: ApiServer, tmp_path: Path
) -> None:
    """On a node running the device plugin and the DRA driver (the base DaemonSet with the
    --dra patch), ``vgpu.io/gpu`` is the device plugin's. Before, a pod asking for it that also
    referenced a ResourceClaim of another driver (a NIC's) was taken for the DRA driver's: the
    region Allocate made for it was not the pod source's, and stayed when the pod was gone
    (the next pod of that name took it over, with this one's limits and owner)."""
    store = PodStore(tmp_path / "shm")
    pod = api.put_pod("net", resources={"vgpu.io/gpu": "1"}, annotations={"a": "b"})
    pod["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimName": "nic-0"}]
    api.put(pod)

    async def scenario() -> None:
        both = node_source(api, tmp_path, store, plugin_places=True, dra_places=True)
        async with running(both) as source:
            await until(lambda: source.by_key("default", "net") is not None)
            found = source.by_key("default", "net")
            assert found is not None and found.dra_claims
            prepare = store_preparer(store, source.assign)  # the device plugin's Allocate
            limits = {UUIDS[1]: GpuLimits(memory=2 * GiB)}
            await asyncio.to_thread(prepare, found, limits, UserGroup())
            assert has_region(store, "net")
            api.delete_pod("net")
            await until(lambda: not has_region(store, "net"))

    asyncio.run(scenario())
    store.close()


def test_a_dra_pod_naming_the_gpu_resource_at_zero_keeps_its_claims_limits(
    api: ApiServer, tmp_path: Path
) -> None:
    """A pod of the DRA driver that also names the device plugin's resource at 0 (the kubelet
    gives it no device, so no Allocate) is still the driver's: its annotations must not raise
    the quota its claim was given. Taken for the device plugin's, the pod source wrote its
    60 GiB annotation over the 2 GiB the driver had prepared."""
    store = PodStore(tmp_path / "shm")
    store.create("default", "sly", {UUIDS[1]: GpuLimits(memory=2 * GiB)})  # DRA's prepare
    pod = api.put_pod(
        "sly",
        resources={"vgpu.io/gpu": "0"},
        annotations={"tensor-fusion.ai/vram-limit": "60Gi"},
    )
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu-0"}]
    api.put(pod)

    async def scenario() -> None:
        both = node_source(api, tmp_path, store, plugin_places=True, dra_places=True)
        async with running(both) as source:
            await asyncio.wait_for(source.synced.wait(), 10)

    asyncio.run(scenario())
    (device,) = store.get("default", "sly").devices
    assert device.memory_limit == 2 * GiB
    store.close()
