"""The daemon's picture of the node: GPUs from the last NVML pass, pods and workers from the
region files, joined into the documents the API serves.

Two kinds of pass, both blocking (run them off the event loop):
``sample`` asks NVML (every sample interval), ``refresh`` reads the regions, gives dead workers'
memory back, records host pids and builds a new ``NodeView`` (every second at least, and right
after every change through the API, so a reply already shows what it did).
"""

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from vgpu_common.limits import hundredths_to_percent, qos_of
from vgpu_limiter.region import ProcessInfo, process_alive

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.cluster import Charge, ClusterPods
from vgpu_hypervisor.daemon.demand import DemandTracker
from vgpu_hypervisor.daemon.pods import PodError, PodKey, PodRecord, PodStore
from vgpu_hypervisor.daemon.scheduler import (
    node_burst_rates,
    node_effective_limits,
    weight_of,
)
from vgpu_hypervisor.daemon.workers import HostPids, ProcessTable, Utilization
from vgpu_hypervisor.gpu import NOT_AVAILABLE, DeviceSnapshot, GpuObserver, NodeSnapshot
from vgpu_hypervisor.gpu.values import or_default

log = logging.getLogger("vgpu_hypervisor")


@dataclasses.dataclass(frozen=True)
class NodeView:
    """One consistent picture; the API and the metrics read the newest one, never the files."""

    taken_at: float
    snapshot: NodeSnapshot | None
    gpus: tuple[models.Gpu, ...] = ()
    pods: tuple[models.Pod, ...] = ()
    workers: tuple[models.Worker, ...] = ()

    def pod(self, namespace: str, name: str) -> models.Pod | None:
        return next((p for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)


class Node:
    """GPUs, pods and workers of this node. Thread-safe."""

    def __init__(
        self,
        observer: GpuObserver,
        store: PodStore,
        boosts: Callable[[], Mapping[str, float]] = dict,
    ) -> None:
        """``boosts``: the boost correction's estimates by GPU UUID (none when it is off)."""
        self.observer = observer
        self.store = store
        self._boosts = boosts
        self._host_pids = HostPids()
        self._unreadable: dict[PodKey, str] = {}  # the pods whose region could not be read, why
        self._processes = ProcessTable()
        self._utilization = Utilization()
        self._snapshot: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._demand = DemandTracker()  # who wants each GPU, pass to pass
        # A pod started to want a GPU and its use is not measured yet: the next pass soon.
        self.measuring = False
        self.view = NodeView(taken_at=0.0, snapshot=None)
        # The cluster's pods of this node when the daemon follows a cluster (Kubernetes): set
        # by the one place that wires it in, as its pod source starts after the node.
        self.cluster: ClusterPods | None = None
        # Called with every new view, in the refreshing thread, one at a time (under the lock):
        # what reacts to the regions' counters (events on Kubernetes pods). Must not block.
        self.watchers: list[Callable[[NodeView], None]] = []
        # What the device plugin has charged pods on each GPU, by UUID, when it runs.
        self.committed: Callable[[], Mapping[str, Charge]] | None = None

    def sample(self) -> NodeSnapshot:
        """One NVML pass (blocking)."""
        snapshot = self.observer.sample()
        with self._lock:
            self._snapshot = snapshot
            self._utilization.update(snapshot)
        return snapshot

    def refresh(self) -> NodeView:
        """Read every region, reclaim dead workers, and publish a new view (blocking)."""
        with self._lock:
            records = [self._settle(record) for record in self.store.scan()]
            self._say_unreadable(records)
            # Weighed and shown by the limits the daemon holds, never raised words (a tenant
            # can write its region): those are set back.
            records = self.store.hold_limits(records)
            self.store.renew_freezes(records)
            # The scheduling policy is the pass's, not the store's: the store only keeps what
            # it weighs (the class and weight the daemon holds) and writes what it decides.
            policies = self.store.held_policies(records)
            demand = self._demand.observe(records)
            self.measuring = demand.measuring
            effective = node_effective_limits(
                records, policies, demand.wanting, demand.unhindered_usage
            )
            self.store.publish_effective(effective)
            self.store.publish_burst(node_burst_rates(records, effective, demand))
            view = self._build(records, effective)
            self.view = view
            for watcher in self.watchers:
                try:
                    watcher(view)
                except Exception:  # a watcher's bug must not stop the passes over the regions
                    log.exception("a watcher of the node's views failed")
            return view

    def _say_unreadable(self, records: list[PodRecord]) -> None:
        """Log a pod whose region became unreadable (cut short, scribbled over) or changed why,
        once, and when it can be read again: the listings and /metrics showed it, the log
        only at the next start."""
        now = {record.key: record.error for record in records if record.error is not None}
        for key, why in now.items():
            if self._unreadable.get(key) != why:
                log.warning("pod %s/%s: %s", *key, why)
        present = {record.key for record in records}
        for key in self._unreadable.keys() - now.keys():
            if key in present:
                log.info("pod %s/%s: its region can be read again", *key)
        self._unreadable = now

    def _settle(self, record: PodRecord) -> PodRecord:
        """The record after its dead workers were reclaimed and host pids recorded."""
        if record.error is not None:
            return record
        if self.store.reap(record):
            try:
                record = self.store.get(record.namespace, record.name)
            except PodError:
                # Gone, or marked deleted, since the scan (a limiter's pod's tenant owns its
                # folder): the scan's record for this pass, the next one knows. Before, the
                # whole pass failed, for every pod.
                return record
        found = self._host_pids.resolve(list(record.processes))
        for process in record.processes:
            host_pid = found.get((process.pid, process.pid_namespace, process.start_time))
            if host_pid is not None:
                self.store.set_host_pid(record, process, host_pid)
        return record

    # Building the documents

    def _build(
        self,
        records: list[PodRecord],
        effective: Mapping[PodKey, Mapping[int, int]] | None = None,
    ) -> NodeView:
        """The view of the records; ``effective``: the pass's effective limits (hundredths,
        by pod and device entry; 0 or absent: the pod's own limit)."""
        snapshot = self._snapshot
        devices = snapshot.devices if snapshot is not None else ()
        index_of = {
            device.uuid.lower(): device.index for device in devices if isinstance(device.uuid, str)
        }
        workers: list[models.Worker] = []
        pods: list[models.Pod] = []
        seen_processes: set[tuple[int, int]] = set()
        for record in records:
            pod_workers = [self._worker(record, process) for process in record.processes]
            seen_processes.update(
                (w.host_pid, process.start_time)
                for w, process in zip(pod_workers, record.processes, strict=True)
                if w.host_pid is not None
            )
            workers.extend(pod_workers)
            pods.append(self._pod(record, pod_workers, index_of, (effective or {}).get(record.key)))
        self._processes.forget_except(seen_processes)
        self._host_pids.forget_except(
            {(p.pid, p.pid_namespace, p.start_time) for r in records for p in r.processes}
        )
        if self.cluster is not None:
            workers = [self._with_container(worker, self.cluster) for worker in workers]
            workers += self._unlimited(devices, self.cluster, workers)
        boosts = {uuid.lower(): boost for uuid, boost in self._boosts().items()}
        committed = None
        if self.committed is not None:
            committed = {uuid.lower(): one for uuid, one in self.committed().items()}
        gpus = tuple(self._gpu(device, pods, workers, boosts, committed) for device in devices)
        return NodeView(time.time(), snapshot, gpus, tuple(pods), tuple(workers))

    def _worker(self, record: PodRecord, process: ProcessInfo) -> models.Worker:
        host_pid = self._host_pids.lookup(process)
        facts = self._processes.facts(host_pid, process.start_time)
        return models.Worker(
            namespace=record.namespace,
            pod=record.name,
            slot=process.slot,
            pid=process.pid,
            host_pid=host_pid,
            started=facts.started,
            command=facts.command,
            alive=process_alive(process),
            last_gpu_call=process.heartbeat_ns / 1e9 if process.heartbeat_ns else None,
            gpus=[
                models.WorkerGpu(
                    uuid=uuid,
                    memory_used=used,
                    host_memory_used=process.host_memory.get(uuid, 0),
                    utilization=self._utilization.of(uuid, host_pid),
                )
                for uuid, used in process.memory.items()
            ],
        )

    def _with_container(self, worker: models.Worker, cluster: ClusterPods) -> models.Worker:
        found = cluster.pod_of(worker.host_pid) if worker.host_pid else None
        if found is None or found.container is None:
            return worker
        return worker.model_copy(update={"container": found.container})

    def _unlimited(
        self,
        devices: Iterable[DeviceSnapshot],
        cluster: ClusterPods,
        limited: list[models.Worker],
    ) -> list[models.Worker]:
        """Processes of the cluster's pods on the GPUs that no region knows: started without the
        limiter, so nothing limits them; shown so that they are seen."""
        known = {worker.host_pid for worker in limited if worker.host_pid}
        memory: dict[int, list[models.WorkerGpu]] = {}
        for device in devices:
            if not isinstance(device.processes, tuple) or not isinstance(device.uuid, str):
                continue
            for process in device.processes:
                if process.pid in known:
                    continue
                used = process.used_memory if isinstance(process.used_memory, int) else 0
                memory.setdefault(process.pid, []).append(
                    models.WorkerGpu(
                        uuid=device.uuid,
                        memory_used=used,
                        utilization=self._utilization.of(device.uuid, process.pid),
                    )
                )
        found = []
        for pid, gpus in sorted(memory.items()):
            owner = cluster.pod_of(pid)
            if owner is None:
                continue
            facts = self._processes.facts(pid, 0)
            found.append(
                models.Worker(
                    namespace=owner.namespace,
                    pod=owner.pod,
                    slot=-1,
                    pid=pid,
                    host_pid=pid,
                    started=facts.started,
                    command=facts.command,
                    alive=True,
                    last_gpu_call=None,
                    gpus=gpus,
                    container=owner.container,
                    limited=False,
                )
            )
        return found

    def _pod(
        self,
        record: PodRecord,
        workers: list[models.Worker],
        index_of: dict[str, int],
        effective: Mapping[int, int] | None,
    ) -> models.Pod:
        gpus = []
        frozen_here = {uuid.lower() for uuid in record.frozen_gpus}
        for device in record.devices:
            held = (effective or {}).get(device.index, 0)
            shares = [
                gpu.utilization
                for worker in workers
                for gpu in worker.gpus
                if gpu.uuid.lower() == device.uuid.lower() and gpu.utilization is not None
            ]
            gpus.append(
                models.PodGpu(
                    uuid=device.uuid,
                    index=index_of.get(device.uuid.lower()),
                    memory_limit=device.memory_limit or None,
                    memory_used=device.memory_used,
                    host_memory_used=device.host_memory_used,
                    oversubscribe=device.oversubscribe,
                    compute_limit=device.compute_percent,
                    utilization=(
                        min(100, sum(shares)) if self._utilization.reports(device.uuid) else None
                    ),
                    compute_burst=(
                        hundredths_to_percent(device.compute_soft_limit)
                        if device.compute_soft_limit
                        else None
                    ),
                    compute_effective=(
                        hundredths_to_percent(held)
                        if held and held < device.compute_limit
                        else None
                    ),
                    frozen=record.frozen
                    and (not frozen_here or device.uuid.lower() in frozen_here),
                    gpu_seconds=device.gpu_ns / 1e9,
                    throttled_seconds=device.throttled_ns / 1e9,
                    burst_seconds=device.burst_ns / 1e9,
                    oom_refusals=device.refusals,
                    last_refused_bytes=device.refused_bytes_last if device.refusals else None,
                )
            )
        return models.Pod(
            namespace=record.namespace,
            name=record.name,
            path=str(record.path),
            created=record.created_ns / 1e9 if record.created_ns else None,
            error=record.error,
            gpus=gpus,
            workers=len(workers),
            phase=self._phase(record),
            frozen=record.frozen,
            qos=qos_of(record.qos).label,
            weight=weight_of(record.qos, record.weight),
        )

    def _phase(self, record: PodRecord) -> str | None:
        return self.cluster.phase(*record.key) if self.cluster is not None else None

    def _gpu(
        self,
        device: DeviceSnapshot,
        pods: Iterable[models.Pod],
        workers: Iterable[models.Worker],
        boosts: Mapping[str, float],
        committed: Mapping[str, Charge] | None,
    ) -> models.Gpu:
        """A GPU with the pods that have an entry for it and the workers holding memory on it,
        and what the device plugin charged pods on it (when it runs)."""
        uuid = device.uuid if isinstance(device.uuid, str) else None
        key = uuid.lower() if uuid else None
        users = [p for p in pods if any(g.uuid.lower() == key for g in p.gpus)]
        power = device.power_draw_mw
        charged = committed.get(key) if committed is not None and key else None
        return models.Gpu(
            index=device.index,
            uuid=uuid,
            name=device.name if isinstance(device.name, str) else None,
            memory_total=or_default(device.memory_total, None),
            memory_used=or_default(device.memory_used, None),
            utilization=or_default(device.gpu_utilization, None),
            memory_utilization=or_default(device.memory_utilization, None),
            temperature_c=or_default(device.temperature_c, None),
            power_draw_w=None if power is NOT_AVAILABLE else power / 1000,
            sm_clock_mhz=or_default(device.sm_clock_mhz, None),
            boost=boosts.get(key) if key else None,
            pods=len(users),
            workers=sum(
                1 for w in workers if any(g.uuid.lower() == key and g.memory_used for g in w.gpus)
            ),
            memory_committed=None if charged is None else charged.memory,
            compute_committed=None if charged is None else hundredths_to_percent(charged.compute),
        )
