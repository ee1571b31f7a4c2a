"""The daemon following a node's pods from an API server (tests/support/apiserver) on
the simulated GPU: regions made, changed and removed from pod objects, workloads limited."""

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hypervisor.conftest import WORKLOAD, Daemon, wait_for
from tests.support.apiserver import ApiServer

GiB = 1 << 30
MiB = 1 << 20
QOS = "tensor-fusion.ai/qos"
VRAM = "tensor-fusion.ai/vram-limit"
COMPUTE = "tensor-fusion.ai/compute-limit"
BACKOFF_MAX_S = 0.5


@pytest.fixture
def daemon(tmp_path: Path, api: ApiServer) -> Iterator[Daemon]:
    flags = (
        "--kubernetes",
        "--node-name", "node-a",
        "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
        "--kube-backoff-max", str(BACKOFF_MAX_S),
        "--gpu-memory-unit", "1MiB",
    )  # fmt: skip
    running = Daemon(tmp_path, extra=flags)
    running.start()
    try:
        yield running
    finally:
        running.close()


def _pod(daemon: Daemon, name: str) -> dict[str, Any] | None:
    reply = daemon.http.get(f"/api/v1/pods/default/{name}")
    return reply.json() if reply.status_code == 200 else None


def _limits(daemon: Daemon, name: str) -> tuple[int | None, float | None] | None:
    pod = _pod(daemon, name)
    if pod is None or not pod["gpus"]:
        return None
    gpu = next(g for g in pod["gpus"] if g["index"] == 0)
    return gpu["memory_limit"], gpu["compute_limit"]


def _run(daemon: Daemon, pod: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WORKLOAD, *args],
        env=daemon.workload_environment(pod),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _refused(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode == 1 and "OUT_OF_MEMORY" in result.stdout + result.stderr


def _memory_total(daemon: Daemon, index: int = 0) -> int:
    """The memory of one GPU of the simulated node, as the daemon reads it."""
    reply = daemon.http.get("/api/v1/gpus")
    total: int = next(g for g in reply.json() if g["index"] == index)["memory_total"]
    return total


def _log(daemon: Daemon) -> str:
    return daemon.log_file.read_text() if daemon.log_file.exists() else ""


def test_a_pod_gets_its_limits_live_and_its_region_goes_after_its_last_worker(
    daemon: Daemon, api: ApiServer, workloads: list[subprocess.Popen[str]]
) -> None:
    api.put_pod("train", annotations={VRAM: "2Gi", COMPUTE: "50", "tensor-fusion.ai/gpu-ids": "0"})
    assert wait_for(lambda: _limits(daemon, "train") == (2 * GiB, 50.0), timeout=15)
    region = daemon.base / "default" / "train" / "shm"
    assert region.exists()
    assert (_pod(daemon, "train") or {})["phase"] == "Running"
    listing = daemon.cli("pods", "list")
    assert listing.returncode == 0 and "default/train (Running)" in listing.stdout, listing

    # The limit holds: 512 MiB of context and 2 GiB do not fit in 2 GiB.
    assert _refused(_run(daemon, "train", "--alloc", "2GiB"))
    fits = _run(daemon, "train", "--alloc", "1GiB")
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert json.loads(fits.stdout)["total_bytes"] == 2 * GiB

    worker = daemon.workload("train", "--alloc", "256MiB", "--hold", "60")
    workloads.append(worker)
    wait_for(lambda: (_pod(daemon, "train") or {}).get("workers") == 1, timeout=15)

    # Lowered live: the worker holds 768 MiB, so another context (512 MiB) no longer fits.
    api.put_pod("train", annotations={VRAM: "1Gi", COMPUTE: "25", "tensor-fusion.ai/gpu-ids": "0"})
    assert wait_for(lambda: _limits(daemon, "train") == (1 * GiB, 25.0), timeout=15)
    assert _refused(_run(daemon, "train", "--alloc", "1MiB"))
    assert worker.poll() is None

    # Deleted: hidden at once, the file kept while the worker lives, then gone.
    api.delete_pod("train")
    wait_for(lambda: _pod(daemon, "train") is None, timeout=15)
    assert region.exists()
    worker.terminate()
    worker.communicate(timeout=10)
    wait_for(lambda: not region.parent.exists(), timeout=15)
    log = _log(daemon)
    assert "pod default/train: region created" in log and "limits changed" in log
    assert "kept until its 1 worker(s) exit" in log


def test_burst_and_qos_annotations_reach_the_region(daemon: Daemon, api: ApiServer) -> None:
    base = {COMPUTE: "30", "tensor-fusion.ai/gpu-ids": "0"}
    api.put_pod("bursty", annotations=base | {"tensor-fusion.ai/compute-burst": "80", QOS: "high"})

    def shown() -> tuple[object, object, object]:
        pod = _pod(daemon, "bursty") or {"gpus": [{"index": 0}]}
        gpu = next(g for g in pod["gpus"] if g["index"] == 0)
        return gpu.get("compute_limit"), gpu.get("compute_burst"), pod.get("qos")

    assert wait_for(lambda: shown() == (30.0, 80.0, "high"), timeout=15), shown()
    api.put_pod("bursty", annotations=base)  # both taken away live
    assert wait_for(lambda: shown() == (30.0, None, "medium"), timeout=15), shown()


def test_the_oversubscribe_annotation_reaches_the_region(daemon: Daemon, api: ApiServer) -> None:
    """vram-oversubscribe: allocations past the limit go to host memory instead of failing."""
    annotations = {VRAM: "1Gi", "tensor-fusion.ai/gpu-ids": "0"}
    api.put_pod("spill", annotations=annotations | {"tensor-fusion.ai/vram-oversubscribe": "true"})
    assert wait_for(lambda: _limits(daemon, "spill") == (1 * GiB, None), timeout=15)
    gpu = next(g for g in (_pod(daemon, "spill") or {})["gpus"] if g["index"] == 0)
    assert gpu["oversubscribe"] is True
    spilled = _run(daemon, "spill", "--alloc", "2GiB")
    assert spilled.returncode == 0, spilled.stdout + spilled.stderr
    api.put_pod("spill", annotations=annotations)  # turned off live
    assert wait_for(
        lambda: (
            next(g for g in (_pod(daemon, "spill") or {})["gpus"] if g["index"] == 0)[
                "oversubscribe"
            ]
            is False
        ),
        timeout=15,
    )
    assert _refused(_run(daemon, "spill", "--alloc", "2GiB"))


@pytest.mark.parametrize("outage_s", [2.0])
def test_the_api_server_away_and_back(daemon: Daemon, api: ApiServer, outage_s: float) -> None:
    api.put_pod("a", annotations={VRAM: "2Gi"})
    assert wait_for(lambda: _limits(daemon, "a") == (2 * GiB, None), timeout=15)
    api.down()
    # Meanwhile the pod changes and another arrives; the daemon cannot know yet.
    api.put_pod("a", annotations={VRAM: "1Gi"})
    api.put_pod("b", annotations={VRAM: "3Gi"})
    assert _refused(_run(daemon, "a", "--alloc", "2GiB"))  # still enforced
    wait_for(lambda: _log(daemon).count("listing the pods again in") >= 2, timeout=10)
    attempts_before = _log(daemon).count("listing the pods again in")
    time.sleep(outage_s)  # the outage itself, not a synchronisation
    attempts = _log(daemon).count("listing the pods again in") - attempts_before
    # Bounded back-off: about one attempt per BACKOFF_MAX_S, never a busy loop.
    assert attempts <= outage_s / BACKOFF_MAX_S + 3, attempts
    api.up()
    assert wait_for(lambda: _limits(daemon, "a") == (1 * GiB, None), timeout=15)
    assert wait_for(lambda: _limits(daemon, "b") == (3 * GiB, None), timeout=15)


def test_410_gone_on_a_watch_lists_again(daemon: Daemon, api: ApiServer) -> None:
    api.put_pod("a", annotations={VRAM: "2Gi"})
    assert wait_for(lambda: _limits(daemon, "a") == (2 * GiB, None), timeout=15)
    lists = sum(1 for r in api.requests if "watch=" not in r and r.startswith("GET /api/v1/pods"))
    api.expire()
    api.put_pod("a", annotations={VRAM: "1Gi"})
    assert wait_for(lambda: _limits(daemon, "a") == (1 * GiB, None), timeout=15)
    wait_for(lambda: "410 Gone" in _log(daemon), timeout=10)
    relists = sum(1 for r in api.requests if "watch=" not in r and r.startswith("GET /api/v1/pods"))
    assert relists == lists + 1


def test_malformed_annotations_are_an_event_and_a_log_line_and_spare_other_pods(
    daemon: Daemon, api: ApiServer
) -> None:
    api.put_pod("bad", annotations={VRAM: "lots", COMPUTE: "30"})
    api.put_pod("good", annotations={VRAM: "2Gi"})
    assert wait_for(lambda: _limits(daemon, "good") == (2 * GiB, None), timeout=15)
    event = wait_for(
        lambda: next((e for e in api.events if e["involvedObject"]["name"] == "bad"), None),
        timeout=15,
    )
    assert event["reason"] == "InvalidLimits" and event["type"] == "Warning"
    assert "pod default/bad: tensor-fusion.ai/vram-limit='lots'" in event["message"]
    assert event["source"]["component"] == "tf-hypervisor"
    assert "pod default/bad: tensor-fusion.ai/vram-limit='lots'" in _log(daemon)
    # What could be read still applies: the compute limit; the memory is the ceiling, here
    # the whole GPU (the pod asks for no vgpu resource), never no limit.
    assert _limits(daemon, "bad") == (_memory_total(daemon), 30.0)


def test_an_annotation_above_the_resources_is_refused(daemon: Daemon, api: ApiServer) -> None:
    api.put_pod("res", resources={"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "1024"},
                annotations={VRAM: "2Gi", "tensor-fusion.ai/gpu-ids": "0"})  # fmt: skip
    assert wait_for(lambda: _limits(daemon, "res") == (1 * GiB, None), timeout=15)
    event = wait_for(lambda: next(iter(api.events), None), timeout=15)
    assert event["reason"] == "LimitRaiseRefused"
    assert event["message"] == (
        "pod default/res: tensor-fusion.ai/vram-limit='2Gi': asks more than 1 GiB, the ceiling "
        "from resource vgpu.io/gpu-memory=1024 (units of 1 MiB); annotations only lower limits, "
        "so 1 GiB applies"
    )
    assert event["message"] in _log(daemon)


def test_a_pod_of_another_node_is_ignored(daemon: Daemon, api: ApiServer) -> None:
    api.put_pod("elsewhere", node="node-b", annotations={VRAM: "2Gi"})
    api.put_pod("here", annotations={VRAM: "2Gi"})
    assert wait_for(lambda: _limits(daemon, "here") == (2 * GiB, None), timeout=15)
    assert _pod(daemon, "elsewhere") is None
    assert not (daemon.base / "default" / "elsewhere").exists()
    assert any("fieldSelector=spec.nodeName%3Dnode-a" in r for r in api.requests)


def test_a_pod_without_vgpu_asks_gets_no_region_and_api_pods_are_left_alone(
    daemon: Daemon, api: ApiServer
) -> None:
    made = daemon.api("POST", "/api/v1/pods", json={"name": "manual", "gpus": {"0": {}}})
    assert made.status_code == 201, made.text
    api.put_pod("plain")
    api.put_pod("here", annotations={VRAM: "2Gi"})
    assert wait_for(lambda: _limits(daemon, "here") == (2 * GiB, None), timeout=15)
    assert _pod(daemon, "plain") is None
    api.expire()  # a fresh list removes only the regions it made
    api.put_pod("here2", annotations={VRAM: "2Gi"})
    assert wait_for(lambda: _limits(daemon, "here2") == (2 * GiB, None), timeout=15)
    assert _pod(daemon, "manual") is not None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--kubernetes",), "Kubernetes is on but NODE_NAME is not set"),
        (("--kubernetes", "--node-name", "n", "--kubeconfig", "/nonexistent/kubeconfig"),
         "cannot read the Kubernetes config: /nonexistent/kubeconfig not found"),
        (("--node-name", "Bad_Name"), "--node-name=Bad_Name: expected a Kubernetes node name"),
        (("--gpu-memory-resource", "gpumem"), "gpu-memory-resource"),
    ],
)  # fmt: skip
def test_bad_kubernetes_settings_are_one_line_errors(
    tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    daemon = Daemon(tmp_path, extra=flags)
    try:
        with pytest.raises(AssertionError, match="daemon exited") as failure:
            daemon.start()
        lines = [line for line in str(failure.value).splitlines() if line.strip()]
        assert message in str(failure.value) and len(lines) == 1, lines
    finally:
        daemon.close()


def test_a_non_root_pods_region_belongs_to_its_user_and_group_and_its_folder_stays_ours(
    daemon: Daemon, api: ApiServer
) -> None:
    """The security context names the region's owner: the container's runAsUser over the
    pod's, fsGroup for the group. The pod folder stays the daemon's (docs/security.md), open to
    the pod's group to enter, so the tenant can use its region but not replace it."""
    api.put_pod(
        "tenant",
        resources={"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "512"},
        security={"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000},
        container_security={"runAsUser": 1001},
    )
    region = daemon.base / "default" / "tenant" / "shm"
    wait_for(region.exists, timeout=15)
    info, folder = region.stat(), region.parent.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (1001, 2000, 0o660)
    assert (folder.st_uid, folder.st_gid, folder.st_mode & 0o7777) == (0, 2000, 0o755)
    # Logged once the store has made it, a moment after the file appears.
    wait_for(lambda: "(owner 1001, group 2000)" in _log(daemon), timeout=15)
    assert "pod default/tenant: region created:" in _log(daemon)

    # No security context: root's, as before.
    api.put_pod("rooted", resources={"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "512"})
    rooted = daemon.base / "default" / "rooted" / "shm"
    wait_for(rooted.exists, timeout=15)
    assert (rooted.stat().st_uid, rooted.stat().st_gid) == (0, 0)
    assert rooted.parent.stat().st_mode & 0o7777 == 0o770
