"""OutOfGpuMemory events: a Kubernetes pod whose allocations the limiter refuses at its memory
limit gets a Warning event naming the GPU, the limit and the size, at most once a minute.

End to end through the daemon on the simulated GPU and the API-server emulator, and in-process
with a clock of the test's own for what happens after the minute."""

import asyncio
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.node import NodeView
from vgpu_hypervisor.daemon.refusals import RefusalLog, RefusalReporter
from vgpu_hypervisor.kubernetes.events import EventPoster
from vgpu_hypervisor.kubernetes.model import KubePod
from vgpu_hypervisor.kubernetes.refusals import KubernetesRefusals

from tests.hypervisor.conftest import Daemon, wait_for
from tests.kubernetes.test_pod_cache import Clock
from tests.kubernetes.test_pod_source import VRAM, _limits, _log, _refused, _run, daemon
from tests.support.apiserver import ApiServer

__all__ = ["daemon"]

GiB = 1 << 30
UUID = "GPU-5157a1e0-0000-4000-8000-000000000001"  # device 0 of the simulated node
GPU_IDS = "tensor-fusion.ai/gpu-ids"


def _oom_events(api: ApiServer, pod: str) -> list[dict[str, Any]]:
    return [
        e
        for e in list(api.events)
        if e["involvedObject"]["name"] == pod and e["reason"] == "OutOfGpuMemory"
    ]


def _refusals(daemon: Daemon, pod: str) -> int | None:
    reply = daemon.http.get(f"/api/v1/pods/default/{pod}")
    if reply.status_code != 200:
        return None
    count: int = next(g for g in reply.json()["gpus"] if g["index"] == 0)["oom_refusals"]
    return count


def test_a_refused_workload_gets_one_event_a_minute(daemon: Daemon, api: ApiServer) -> None:
    api.put_pod("small", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "small") == (GiB, None), timeout=15)
    fits = _run(daemon, "small", "--alloc", "256MiB")
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert _refused(_run(daemon, "small", "--alloc", "2GiB"))

    (event,) = wait_for(lambda: _oom_events(api, "small"), timeout=15)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == api.pods[("default", "small")]["metadata"]["uid"]
    assert event["source"]["component"] == "tf-hypervisor"
    message = event["message"]
    assert f"pod default/small: an allocation refused on GPU 0 ({UUID})" in message
    assert "past its memory limit of 1 GiB; the last asked for 2 GiB" in message
    assert message in _log(daemon)

    # A second refusal within the minute: counted, but no second event. Another pod refused
    # after it has its event posted by a later pass, so by then the second one would be there.
    assert _refused(_run(daemon, "small", "--alloc", "3GiB"))
    assert wait_for(lambda: _refusals(daemon, "small") == 2, timeout=15)
    api.put_pod("other", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "other") == (GiB, None), timeout=15)
    assert _refused(_run(daemon, "other", "--alloc", "2GiB"))
    wait_for(lambda: _oom_events(api, "other"), timeout=15)
    assert len(_oom_events(api, "small")) == 1
    # The allocation that fits and a pod never refused: no event.
    api.put_pod("calm", annotations={VRAM: "1Gi", GPU_IDS: "0"})
    assert wait_for(lambda: _limits(daemon, "calm") == (GiB, None), timeout=15)
    calm = _run(daemon, "calm", "--alloc", "256MiB")
    assert calm.returncode == 0, calm.stdout + calm.stderr
    assert _refusals(daemon, "calm") == 0
    assert not _oom_events(api, "calm")


def test_an_oversubscribed_pod_past_its_limit_gets_no_event(daemon: Daemon, api: ApiServer) -> None:
    annotations = {VRAM: "1Gi", GPU_IDS: "0", "tensor-fusion.ai/vram-oversubscribe": "true"}
    api.put_pod("spill", annotations=annotations)
    assert wait_for(lambda: _limits(daemon, "spill") == (GiB, None), timeout=15)
    spilled = _run(daemon, "spill", "--alloc", "2GiB")
    assert spilled.returncode == 0, spilled.stdout + spilled.stderr
    document = daemon.http.get("/api/v1/pods/default/spill").json()
    gpu = next(g for g in document["gpus"] if g["index"] == 0)
    assert (gpu["oom_refusals"], gpu["last_refused_bytes"]) == (0, None)
    assert not _oom_events(api, "spill")


class Pods:
    """The pod source's lookup, for pods of the test's own."""

    def __init__(self, *pods: KubePod) -> None:
        self._pods = {(p.namespace, p.name): p for p in pods}

    def by_uid(self, uid: str) -> KubePod | None:
        return next((p for p in self._pods.values() if p.uid == uid), None)

    def by_key(self, namespace: str, name: str) -> KubePod | None:
        return self._pods.get((namespace, name))


def _view(name: str, refusals: int, created: float, last: int = GiB) -> NodeView:
    gpu = models.PodGpu(
        uuid=UUID,
        index=0,
        memory_limit=GiB,
        memory_used=512 << 20,
        compute_limit=None,
        utilization=None,
        oom_refusals=refusals,
        last_refused_bytes=last if refusals else None,
    )
    pod = models.Pod(
        namespace="default",
        name=name,
        path=f"/shm/default/{name}/shm",
        created=created,
        error=None,
        gpus=[gpu],
        workers=1,
    )
    return NodeView(taken_at=created, snapshot=None, pods=(pod,))


def test_refusals_in_the_quiet_minute_are_told_after_it(api: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    train = KubePod("default", "train", "uid-train", "node-a", "Running", "1", "")
    old = KubePod("default", "old", "uid-old", "node-a", "Running", "1", "")

    async def scenario() -> list[str]:
        client = AsyncClient(KubeConfig.from_file(api.kubeconfig(tmp_path / "kubeconfig")))
        events = EventPoster(client, "node-a", asyncio.get_running_loop(), clock=clock)
        reporter = RefusalReporter(KubernetesRefusals(Pods(train, old), events, RefusalLog()))
        now = 2e9  # regions made after the reporter started: every refusal is news
        told = []
        for refusals, minutes in ((0, 0), (1, 0), (2, 0.5), (5, 0.9), (5, 1.1), (6, 1.2)):
            clock.now = 1000.0 + 60 * minutes
            reporter.observe(_view("train", refusals, now, last=refusals * GiB))
            await asyncio.sleep(0)  # the post is scheduled on the loop
            await events.drain()
            told = [e["message"] for e in _oom_events(api, "train")]
        # A region that had refusals before the daemon started: not news; one more is.
        reporter.observe(_view("old", 7, created=1.0))
        reporter.observe(_view("old", 7, created=1.0))
        await asyncio.sleep(0)
        await events.drain()
        assert not _oom_events(api, "old")
        reporter.observe(_view("old", 8, created=1.0))
        await asyncio.sleep(0)
        await events.drain()
        (old_event,) = _oom_events(api, "old")
        assert "an allocation refused" in old_event["message"]
        return told

    first, second = asyncio.run(scenario())
    assert "an allocation refused" in first and "the last asked for 1 GiB" in first
    # 2 and 5 came within the minute of the first event: told together once it was over.
    assert "4 allocations refused" in second and "the last asked for 5 GiB" in second
