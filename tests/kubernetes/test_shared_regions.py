"""One pod's region shared by the pod source, the device plugin's binding and the DRA driver:
the pod source in-process against the API-server emulator, the plugin's region step
(store_preparer, what its binder calls per container) and the driver's Preparer, as the daemon
wires them (the plugin's bindings standing in as a dict of the GPUs they gave)."""

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodError, PodStore
from vgpu_hypervisor.device_plugin.allocation import LIBRARIES, Layout
from vgpu_hypervisor.device_plugin.prepare import store_preparer
from vgpu_hypervisor.dra.claims import DRIVER
from vgpu_hypervisor.dra.prepare import NodeConfig, Preparer
from vgpu_hypervisor.dra.quota import RELEASED
from vgpu_hypervisor.kubernetes.annotations import NodeGpu
from vgpu_hypervisor.kubernetes.model import KubePod, UserGroup
from vgpu_hypervisor.kubernetes.pod_source import PodSource, share_regions

from tests.kubernetes.test_pod_cache import has_region, node_source, running, until
from tests.limiter.test_region import claim, raw
from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import POD

UUIDS = ("GPU-00000000-1111-2222-3333-444444444444", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
GiB = 1 << 30
GPUS = [NodeGpu(i, uuid, "NVIDIA H100 80GB HBM3", 80 * GiB) for i, uuid in enumerate(UUIDS)]
NODE = "node-a"


class Claims:
    """The API server as the driver's Prepare reads it: the claim ``{pod}-gpu`` allocated
    2 GiB and 20 % of GPU 1 (``{pod}-gpu0``: 1 GiB and 10 % of GPU 0, UID ``claim0-…``) and
    reserved for its pod, and the pods the pod source knows."""

    def __init__(self, source: PodSource) -> None:
        self.source = source

    def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        on_first = name.endswith("-gpu0")
        pod = self.pod(namespace, name.removesuffix("-gpu0" if on_first else "-gpu"))
        result = {
            "request": "gpu",
            "driver": DRIVER,
            "pool": NODE,
            "device": "gpu-0" if on_first else "gpu-1",
            "consumedCapacity": (
                {"memory": "1Gi", "compute": "10"}
                if on_first
                else {"memory": "2Gi", "compute": "20"}
            ),
        }
        uid = f"claim0-{pod.uid}" if on_first else f"claim-{pod.uid}"
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {
                "allocation": {"devices": {"results": [result]}},
                "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}],
            },
        }

    def pod(self, namespace: str, name: str) -> KubePod:
        pod = self.source.by_key(namespace, name)
        assert pod is not None
        return pod


def preparer(store: PodStore, source: PodSource, tmp_path: Path) -> Preparer:
    libraries = tmp_path / "lib"
    libraries.mkdir(exist_ok=True)
    for library in LIBRARIES:
        (libraries / library).touch()
    layout = Layout(host_lib_dir=libraries, host_base=store.base, gpus=tuple(GPUS))
    config = NodeConfig(layout, NODE, tuple(GPUS), {}, cdi_dir=tmp_path / "cdi")
    return Preparer(config, store, Claims(source))


@asynccontextmanager
async def following(
    api: ApiServer, tmp_path: Path, store: PodStore, given: Mapping[str, tuple[str, ...]]
) -> AsyncIterator[tuple[PodSource, Preparer]]:
    """A daemon of the base DaemonSet with the --dra patch: the pod source (listed once), the
    plugin's bindings (``given``: pod UID → GPUs) and the DRA driver, wired as the daemon
    wires them. Leaving it is the daemon stopping."""
    source = node_source(api, tmp_path, store, plugin_places=True, dra_places=True, gpus=GPUS)
    driver = preparer(store, source, tmp_path)
    share_regions(source, lambda uid: given.get(uid, ()), driver)
    async with running(source):
        await asyncio.wait_for(source.synced.wait(), 10)
        yield source, driver


def put_pod_of_both(
    api: ApiServer, name: str, annotations: dict[str, str], *, plugin: bool = True
) -> str:
    """A pod asking one ``vgpu.io/gpu`` of the device plugin (unless not ``plugin``) and
    referencing a claim of ours; its UID."""
    resources = {"vgpu.io/gpu": "1"} if plugin else {}
    pod = api.put_pod(name, resources=resources, annotations=annotations)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    return str(api.put(pod)["metadata"]["uid"])


def memory(store: PodStore, name: str) -> dict[str, int]:
    return {d.uuid: d.memory_limit for d in store.get("default", name).devices}


def allocate(store: PodStore, source: PodSource, name: str, uuid: str) -> None:
    """The plugin's binding of one container given ``uuid``: its region step."""
    pod = source.by_key("default", name)
    assert pod is not None
    store_preparer(store, source.assign)(pod, {uuid: GpuLimits(memory=80 * GiB)}, UserGroup())


def test_a_pod_of_both_paths_keeps_its_claims_quota_across_a_restart(
    api: ApiServer, tmp_path: Path
) -> None:
    """A pod given GPU 0 by the device plugin and GPU 1 by a claim of ours (2 GiB): its
    annotations' 60 GiB go on GPU 0 only. Before, a daemon that restarted took every GPU of the
    pod's region for the plugin's and wrote 60 GiB over the claim's 2 GiB on GPU 1."""
    store = PodStore(tmp_path / "shm")
    uid = put_pod_of_both(api, "both", {"tensor-fusion.ai/vram-limit": "60Gi"})
    given: dict[str, tuple[str, ...]] = {}

    async def before_restart() -> None:
        async with following(api, tmp_path, store, given) as (source, driver):
            await until(lambda: source.by_key("default", "both") is not None)
            allocate(store, source, "both", UUIDS[0])
            given[uid] = (UUIDS[0],)
            await asyncio.to_thread(driver.prepare, "default", "both-gpu", f"claim-{uid}")
            assert memory(store, "both") == {UUIDS[0]: 60 * GiB, UUIDS[1]: 2 * GiB}

    async def after_restart() -> None:
        async with following(api, tmp_path, store, given) as (source, _):
            assert memory(store, "both") == {UUIDS[0]: 60 * GiB, UUIDS[1]: 2 * GiB}
            # Annotations still change the plugin's GPU, live, and only it.
            pod = api.pods[("default", "both")]
            pod["metadata"]["annotations"] = {"tensor-fusion.ai/vram-limit": "50Gi"}
            api.put(pod)
            await until(lambda: memory(store, "both")[UUIDS[0]] == 50 * GiB)
            assert source.by_uid(uid) is not None
            assert memory(store, "both")[UUIDS[1]] == 2 * GiB

    asyncio.run(before_restart())
    asyncio.run(after_restart())
    store.close()


def test_a_pod_whose_claim_is_prepared_before_its_allocation_keeps_its_claims_quota(
    api: ApiServer, tmp_path: Path
) -> None:
    """The kubelet may prepare a pod's claims before the binder learns which pod its
    Allocate was for. Before, the pod source then took the GPUs of the region the driver had
    made for the plugin's, and wrote 60 GiB over the claim's 2 GiB."""
    store = PodStore(tmp_path / "shm")
    uid = put_pod_of_both(api, "early", {"tensor-fusion.ai/vram-limit": "60Gi"})
    given: dict[str, tuple[str, ...]] = {}

    async def scenario() -> None:
        async with following(api, tmp_path, store, given) as (source, driver):
            await until(lambda: source.by_key("default", "early") is not None)
            await asyncio.to_thread(driver.prepare, "default", "early-gpu", f"claim-{uid}")
            pod = api.pods[("default", "early")]
            pod["metadata"]["annotations"]["tensor-fusion.ai/compute-limit"] = "50"
            api.put(pod)  # an event: the pod source applies the pod again
            await until(
                lambda: (
                    (found := source.by_key("default", "early")) is not None
                    and "tensor-fusion.ai/compute-limit" in found.annotations
                )
            )
            await asyncio.sleep(0.3)
            assert memory(store, "early") == {UUIDS[1]: 2 * GiB}
            allocate(store, source, "early", UUIDS[0])
            assert memory(store, "early") == {UUIDS[1]: 2 * GiB, UUIDS[0]: 60 * GiB}

    asyncio.run(scenario())
    store.close()


def put_two_container_pod(api: ApiServer, name: str, annotations: dict[str, str]) -> None:
    """A pod of two containers, each asking one GPU of the device plugin."""
    pod = api.put_pod(name, resources={"vgpu.io/gpu": "1"}, annotations=annotations)
    second = dict(pod["spec"]["containers"][0], name="second")
    pod["spec"]["containers"].append(second)
    api.put(pod)


def plugin_source(api: ApiServer, tmp_path: Path, store: PodStore) -> PodSource:
    return node_source(api, tmp_path, store, plugin_places=True, gpus=GPUS)


def test_annotations_reach_every_containers_gpus(api: ApiServer, tmp_path: Path) -> None:
    """Each container is bound on its own: before, the GPUs of the one bound last replaced
    the pod's, and a lowered limit reached that container's GPU only."""
    store = PodStore(tmp_path / "shm")
    put_two_container_pod(api, "pair", {})

    async def scenario() -> None:
        async with running(plugin_source(api, tmp_path, store)) as source:
            await until(lambda: source.by_key("default", "pair") is not None)
            allocate(store, source, "pair", UUIDS[0])
            allocate(store, source, "pair", UUIDS[1])
            assert memory(store, "pair") == {UUIDS[0]: 80 * GiB, UUIDS[1]: 80 * GiB}
            pod = api.pods[("default", "pair")]
            pod["metadata"]["annotations"] = {"tensor-fusion.ai/vram-limit": "4Gi"}
            api.put(pod)
            await until(lambda: memory(store, "pair")[UUIDS[1]] == 4 * GiB)
            assert memory(store, "pair")[UUIDS[0]] == 4 * GiB

    asyncio.run(scenario())
    store.close()


def test_a_multi_container_pod_made_again_over_its_deleted_namesake_takes_its_file_over(
    api: ApiServer, tmp_path: Path
) -> None:
    """A StatefulSet's pod of two containers (one GPU each), force-deleted while a worker still
    runs, made again under its name: the file lists both GPUs, each container's binding asks
    for one. Before, each was refused for good (fewer GPUs than the file lists) while the old
    worker ran: the new pod's processes failed after their wait. Now the pod takes the file
    over once it holds both GPUs; the binding of a container before that is tried again."""
    store = PodStore(tmp_path / "shm")
    put_two_container_pod(api, "web-0", {})
    old = store.create("default", "web-0", {u: GpuLimits(memory=8 * GiB) for u in UUIDS})
    with raw(old.path) as pointer:
        claim(pointer, 0, 4242, [GiB, GiB])  # a worker of the old pod, judged alive
    store.delete("default", "web-0", force=True)
    assert not has_region(store, "web-0")

    async def scenario() -> None:
        async with running(plugin_source(api, tmp_path, store)) as source:
            await until(lambda: source.by_key("default", "web-0") is not None)
            with pytest.raises(PodError):  # the pod holds GPU 0 only, so far
                allocate(store, source, "web-0", UUIDS[0])
            allocate(store, source, "web-0", UUIDS[1])
            allocate(store, source, "web-0", UUIDS[0])  # the binder's next pass
            assert memory(store, "web-0") == {UUIDS[0]: 80 * GiB, UUIDS[1]: 80 * GiB}
            # The old worker's usage is the new pod's: old and new share the one limit.
            assert [d.memory_used for d in store.get("default", "web-0").devices] == [GiB, GiB]

    asyncio.run(scenario())
    store.close()


def test_a_pod_made_again_on_fewer_gpus_than_its_deleted_namesakes_file_is_still_refused(
    api: ApiServer, tmp_path: Path
) -> None:
    """The security property stands: a pod never takes over a file listing a GPU it was not
    given (its programs could use it under limits the daemon does not hold)."""
    store = PodStore(tmp_path / "shm")
    api.put_pod("solo", resources={"vgpu.io/gpu": "1"})
    old = store.create("default", "solo", {u: GpuLimits(memory=8 * GiB) for u in UUIDS})
    with raw(old.path) as pointer:
        claim(pointer, 0, 4242, [GiB, GiB])
    store.delete("default", "solo", force=True)

    async def scenario() -> None:
        async with running(plugin_source(api, tmp_path, store)) as source:
            await until(lambda: source.by_key("default", "solo") is not None)
            for _ in range(2):
                with pytest.raises(PodError):
                    allocate(store, source, "solo", UUIDS[0])
            assert not has_region(store, "solo")

    asyncio.run(scenario())
    store.close()


@pytest.mark.parametrize("made_again_as", ["a pod of a claim", "a device-plugin pod"])
def test_an_old_pods_claim_unprepared_after_its_namesake_was_made_leaves_its_region(
    api: ApiServer, tmp_path: Path, made_again_as: str
) -> None:
    """A StatefulSet's DRA pod deleted with force and made again under its name: the kubelet
    may prepare the new pod's claim before it unprepares the old one's, and the new pod may be
    the device plugin's alone (its region the pod source's, no claim of it in the driver's
    checkpoint). Before, that Unprepare deleted the new pod's region (its processes then found
    none), or, while they ran, failed for as long as they did (the old pod never finished)."""
    store = PodStore(tmp_path / "shm")
    old_uid = put_pod_of_both(api, "db-0", {}, plugin=False)
    given: dict[str, tuple[str, ...]] = {}
    of_a_claim = made_again_as == "a pod of a claim"

    async def scenario() -> None:
        async with following(api, tmp_path, store, given) as (source, driver):
            await until(lambda: source.by_key("default", "db-0") is not None)
            await asyncio.to_thread(driver.prepare, "default", "db-0-gpu", f"claim-{old_uid}")
            api.delete_pod("db-0")
            if of_a_claim:
                new_uid = put_pod_of_both(api, "db-0", {}, plugin=False)
            else:
                new_uid = str(
                    api.put_pod("db-0", resources={"vgpu.io/gpu": "1"})["metadata"]["uid"]
                )
            assert new_uid != old_uid
            await until(lambda: source.by_uid(new_uid) is not None)
            if of_a_claim:
                await asyncio.to_thread(driver.prepare, "default", "db-0-gpu", f"claim-{new_uid}")
            else:
                allocate(store, source, "db-0", UUIDS[0])
                given[new_uid] = (UUIDS[0],)
                await until(lambda: source.region_made_for("default", "db-0") == new_uid)
            before = memory(store, "db-0")
            await asyncio.to_thread(driver.unprepare, "default", "db-0-gpu", f"claim-{old_uid}")
            assert memory(store, "db-0") == before
            assert set(driver.prepared()) == ({f"claim-{new_uid}"} if of_a_claim else set())
            if of_a_claim:
                assert before == {UUIDS[1]: 2 * GiB} and driver.pod_gpus(new_uid) == {UUIDS[1]}
                await asyncio.to_thread(driver.unprepare, "default", "db-0-gpu", f"claim-{new_uid}")
                assert not has_region(store, "db-0")

    asyncio.run(scenario())
    store.close()


@pytest.mark.parametrize("plugin_gpu", [0, 1])
def test_a_claim_that_leaves_releases_its_gpu_but_not_the_plugins(
    api: ApiServer, tmp_path: Path, plugin_gpu: int
) -> None:
    """A pod given a GPU by the device plugin (60 GiB by its annotation), with a claim on GPU 1
    (2 GiB) and one on GPU 0 (1 GiB); the claim on GPU 0 unprepared while the other stays.
    Before, GPU 0 kept the departed claim's 1 GiB until the pod's last claim went. Now a GPU a
    claim leaves holds nothing, unless the plugin gave it to the pod: then it gets the pod's
    limits back; the plugin's GPU that a claim still holds is left as it is."""
    store = PodStore(tmp_path / "shm")
    uid = put_pod_of_both(api, "both", {"tensor-fusion.ai/vram-limit": "60Gi"})
    given: dict[str, tuple[str, ...]] = {}

    async def scenario() -> None:
        async with following(api, tmp_path, store, given) as (source, driver):
            await until(lambda: source.by_key("default", "both") is not None)
            allocate(store, source, "both", UUIDS[plugin_gpu])
            given[uid] = (UUIDS[plugin_gpu],)
            for claim, claim_uid in (("both-gpu", f"claim-{uid}"), ("both-gpu0", f"claim0-{uid}")):
                await asyncio.to_thread(driver.prepare, "default", claim, claim_uid)
            assert memory(store, "both") == {UUIDS[0]: GiB, UUIDS[1]: 2 * GiB}
            await asyncio.to_thread(driver.unprepare, "default", "both-gpu0", f"claim0-{uid}")
            limits = {d.uuid: d.limits.value for d in store.get("default", "both").devices}
            gpu0 = GpuLimits(60 * GiB) if plugin_gpu == 0 else RELEASED
            assert limits == {UUIDS[0]: gpu0, UUIDS[1]: GpuLimits(2 * GiB, 2000)}

    asyncio.run(scenario())
    store.close()


def test_a_pod_made_again_while_the_daemon_was_away_does_not_keep_its_namesakes_gpu(
    api: ApiServer, tmp_path: Path
) -> None:
    """A StatefulSet's pod given GPU 0, deleted and made again under its name (given GPU 1)
    while the daemon was away (a restart, or a watch that expired: both list the pods afresh).
    Before, the list found a pod of that name and applied the new pod over the old one's
    region: it kept GPU 0 at the old pod's 80 GiB beside its own GPU 1."""
    store = PodStore(tmp_path / "shm")
    given: dict[str, tuple[str, ...]] = {}
    old_uid = str(api.put_pod("web-0", resources={"vgpu.io/gpu": "1"})["metadata"]["uid"])

    async def follow(check: Any) -> None:
        source = plugin_source(api, tmp_path, store)
        share_regions(source, lambda uid: given.get(uid, ()), None)
        async with running(source):
            await until(lambda: source.synced.is_set() and check())

    asyncio.run(follow(lambda: True))
    given[old_uid] = (UUIDS[0],)
    asyncio.run(follow(lambda: memory(store, "web-0") == {UUIDS[0]: 80 * GiB}))
    api.delete_pod("web-0")
    new_uid = str(api.put_pod("web-0", resources={"vgpu.io/gpu": "1"})["metadata"]["uid"])
    given[new_uid] = (UUIDS[1],)
    asyncio.run(follow(lambda: has_region(store, "web-0")))
    assert memory(store, "web-0") == {UUIDS[1]: 80 * GiB}
    store.close()


@pytest.mark.parametrize("worker", [False, True], ids=["no-worker", "a-worker-still-runs"])
def test_claims_unprepared_after_the_pod_source_deleted_the_region_make_none(
    api: ApiServer, tmp_path: Path, worker: bool
) -> None:
    """A pod of both paths (GPU 0 from the device plugin, a claim on GPU 1 and one on GPU 0)
    being deleted: the pod source deletes its region as the pod terminates (kept, marked
    deleted, while a worker still runs), before the kubelet unprepares the claims. Before, the
    first claim's Unprepare made the region again with the other claim's quota, or, over the
    file kept for the worker, failed (it lists GPU 0, which the other claim does not hold) for
    as long as the worker ran. Now neither Unprepare makes a region, nor revives the file."""
    store = PodStore(tmp_path / "shm")
    uid = put_pod_of_both(api, "both", {"tensor-fusion.ai/vram-limit": "60Gi"})
    given: dict[str, tuple[str, ...]] = {}

    async def scenario() -> None:
        async with following(api, tmp_path, store, given) as (source, driver):
            await until(lambda: source.by_key("default", "both") is not None)
            allocate(store, source, "both", UUIDS[0])
            given[uid] = (UUIDS[0],)
            claims = (("both-gpu", f"claim-{uid}"), ("both-gpu0", f"claim0-{uid}"))
            for name, claim_uid in claims:
                await asyncio.to_thread(driver.prepare, "default", name, claim_uid)
            path = store.get("default", "both").path
            if worker:
                with raw(path) as pointer:
                    claim(pointer, 0, 4242, [GiB, GiB])  # a worker of the pod, judged alive
            api.store.delete(POD, "default", "both")  # terminating: the pod source deletes
            await until(lambda: not has_region(store, "both"))
            for name, claim_uid in reversed(claims):
                await asyncio.to_thread(driver.unprepare, "default", name, claim_uid)
                assert not has_region(store, "both")
                assert path.exists() == worker  # the file kept for the worker only
            assert driver.prepared() == {}
            await asyncio.sleep(0.3)  # the pod's last events: still none
            assert not has_region(store, "both")

    asyncio.run(scenario())
    store.close()
