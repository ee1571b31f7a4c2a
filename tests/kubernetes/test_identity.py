"""Host processes tied to Kubernetes pods and containers through /proc/PID/cgroup."""

import os
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon.node import Node
from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_hypervisor.gpu import NOT_AVAILABLE, DeviceSnapshot, NodeSnapshot
from vgpu_hypervisor.gpu.snapshot import ProcessMemory
from vgpu_hypervisor.kubernetes.identity import CgroupIdentity, CgroupPods, parse_cgroup, pod_of
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod

UID = "4f2c8d1e-9a7b-4c3d-8e1f-0a1b2c3d4e5f"
CID = "a3f5c0e1b2d4" * 5 + "9f8e"  # 64 hex digits
assert len(CID) == 64
UNDERSCORED = UID.replace("-", "_")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, systemd driver, containerd
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice"
         f"/cri-containerd-{CID}.scope\n", CgroupIdentity(UID, CID)),
        # cgroup v2, systemd driver, CRI-O, a Guaranteed pod (no QoS level)
        (f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/crio-{CID}.scope\n",
         CgroupIdentity(UID, CID)),
        # cgroup v1, cgroupfs driver, docker
        (f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n",
         CgroupIdentity(UID, CID)),
        # cgroup v1, systemd driver, docker
        (f"4:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}"
         f".slice/docker-{CID}.scope\n", CgroupIdentity(UID, CID)),
        # the pod's own cgroup (the sandbox)
        (f"0::/kubepods/pod{UID}\n", CgroupIdentity(UID, "")),
        # not a pod
        ("0::/system.slice/containerd.service\n", None),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", None),
        ("", None),
    ],
)  # fmt: skip
def test_cgroup_paths_of_every_driver_and_runtime(text: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup(text) == expected


class Pods:
    """The pod source's cache, as the node sees it: pods by UID."""

    def __init__(self, *pods: KubePod) -> None:
        self.pods = {pod.uid: pod for pod in pods}

    def by_uid(self, uid: str) -> KubePod | None:
        return self.pods.get(uid)

    def by_key(self, namespace: str, name: str) -> KubePod | None:
        return next((p for p in self.pods.values() if p.key == f"{namespace}/{name}"), None)


CONTAINERS = (
    KubeContainer("sidecar", container_id="f" * 64),
    KubeContainer("main", container_id=CID),
)
POD = KubePod(
    "ml", "train", UID, "node-a", "Running", "7", "2026-01-01T00:00:00Z", containers=CONTAINERS
)


def fake_proc(root: Path, pid: int, cgroup: str) -> Path:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    return root


def test_a_pid_maps_to_namespace_pod_and_container(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 4242, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    found = pod_of(4242, Pods(POD), proc)
    assert found is not None
    assert (found.namespace, found.pod, found.container) == ("ml", "train", "main")
    assert pod_of(4243, Pods(POD), proc) is None  # no such process
    assert pod_of(4242, Pods(), proc) is None  # a pod not of this node
    cluster = CgroupPods(Pods(POD), proc)  # what the node's view is given
    assert cluster.pod_of(4242) == found
    assert cluster.phase("ml", "train") == "Running"
    assert cluster.phase("ml", "other") is None


class Observer:
    """Stands in for NVML: one GPU on which one process holds memory."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def sample(self) -> NodeSnapshot:
        device = DeviceSnapshot(
            index=0, uuid="GPU-00000000-1111-2222-3333-444444444444", name="NVIDIA H100",
            memory_total=80 << 30, memory_used=1 << 30, gpu_utilization=0, memory_utilization=0,
            temperature_c=30, power_draw_mw=100_000, sm_clock_mhz=1980,
            processes=(ProcessMemory(self.pid, 1 << 30),), process_utilization=NOT_AVAILABLE,
        )  # fmt: skip
        return NodeSnapshot(backend="simulated", taken_at=0.0, duration=0.0, devices=(device,))


def test_a_pod_process_without_the_limiter_is_a_worker_shown_unlimited(tmp_path: Path) -> None:
    pid = os.getpid()  # a real process: its command line is read as for any worker
    proc = fake_proc(tmp_path / "proc", pid, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    store = PodStore(tmp_path / "shm")
    node = Node(Observer(pid), store)  # type: ignore[arg-type]
    node.sample()
    assert node.refresh().workers == ()  # Kubernetes off: only the regions' workers
    node.cluster = CgroupPods(Pods(POD), proc)
    (worker,) = node.refresh().workers
    assert (worker.namespace, worker.pod, worker.container) == ("ml", "train", "main")
    assert worker.host_pid == pid and not worker.limited
    assert worker.gpus[0].memory_used == 1 << 30
    assert worker.command is not None and str(pid) not in worker.command
    store.close()
