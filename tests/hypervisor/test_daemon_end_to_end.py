"""End to end on the simulated GPU: workloads under the limiter in the daemon's pods."""

import json
import os
import signal
import subprocess
import time
from typing import Any

import psutil
import pytest
from vgpu_limiter.region import open_region

from tests.hypervisor.conftest import WORKLOAD, Daemon, wait_for

GiB = 1 << 30
MiB = 1 << 20


def _create(daemon: Daemon, name: str, **gpu: object) -> dict[str, Any]:
    reply = daemon.api("POST", "/api/v1/pods", json={"name": name, "gpus": {"0": gpu}})
    assert reply.status_code == 201, reply.text
    document: dict[str, Any] = reply.json()
    return document


def _pod(daemon: Daemon, name: str) -> dict[str, Any]:
    document: dict[str, Any] = daemon.http.get(f"/api/v1/pods/default/{name}").json()
    return document


def _workers(daemon: Daemon, pod: str) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = daemon.http.get("/api/v1/workers", params={"pod": pod}).json()
    return workers


def _state(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod without its utilization figures (samples that differ from one pass to the next)."""
    gpus = [{k: v for k, v in gpu.items() if k != "utilization"} for gpu in pod["gpus"]]
    return pod | {"gpus": gpus}


def _gpu0(document: dict[str, Any]) -> dict[str, Any]:
    """GPU 0's entry of a pod (by index) or of a worker (the GPU where it holds memory first)."""
    if document["gpus"] and "index" not in document["gpus"][0]:
        return max(document["gpus"], key=lambda gpu: gpu["memory_used"])
    return next(gpu for gpu in document["gpus"] if gpu["index"] == 0)


def test_a_worker_is_seen_everywhere_and_reclaimed_after_sigkill(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    _create(daemon, "train", memory="4GiB")
    worker = daemon.workload("train", "--alloc", "1GiB", "--hold", "60")
    workloads.append(worker)
    found = wait_for(lambda: _workers(daemon, "train"), timeout=10)
    (seen,) = found
    assert seen["host_pid"] == worker.pid and seen["pid"] == worker.pid and seen["alive"]
    assert "vgpu-sim-workload" in seen["command"] and "--alloc 1GiB" in seen["command"]
    wait_for(lambda: _gpu0(_workers(daemon, "train")[0])["memory_used"] >= GiB, timeout=10)
    used = _gpu0(_pod(daemon, "train"))["memory_used"]
    assert used == GiB + 512 * MiB  # the allocation and the context

    listing = daemon.cli("workers", "--json")
    assert listing.returncode == 0, listing.stderr
    assert [w["host_pid"] for w in json.loads(listing.stdout)] == [worker.pid]
    table = daemon.cli("workers")
    assert str(worker.pid) in table.stdout and "1.5 GiB" in table.stdout

    metrics = daemon.http.get("/metrics").text
    assert any(
        line.startswith("tf_worker_memory_used_bytes{")
        and f'pid="{worker.pid}"' in line
        and float(line.rsplit(" ", 1)[1]) == used
        for line in metrics.splitlines()
    )

    top = daemon.cli("top", "--interval", "0.2", stdin="q\n")
    assert top.returncode == 0, top.stderr
    assert "default/train" in top.stdout and str(worker.pid) in top.stdout

    worker.send_signal(signal.SIGKILL)
    worker.wait()
    started = time.monotonic()
    wait_for(lambda: _gpu0(_pod(daemon, "train"))["memory_used"] == 0, timeout=5)
    assert time.monotonic() - started < 2.0
    assert _workers(daemon, "train") == []


def test_a_limit_changed_live_is_obeyed(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    _create(daemon, "live", compute=60)
    worker = daemon.workload("live", "--kernels", "100000", "--kernel-us", "2000")
    workloads.append(worker)

    def utilization_near(target: float) -> bool:
        value = _gpu0(_pod(daemon, "live"))["utilization"]
        return value is not None and abs(value - target) <= 8

    wait_for(lambda: utilization_near(60), timeout=10, step=0.2)
    update = daemon.cli("pods", "update", "live", "--compute", "0=20")
    assert update.returncode == 0, update.stderr
    wait_for(lambda: utilization_near(20), timeout=10, step=0.2)

    # Memory: the next allocation over a lowered limit fails.
    assert daemon.cli("pods", "update", "live", "--mem", "0=1GiB").returncode == 0
    second = daemon.workload("live", "--alloc", "1GiB")
    workloads.append(second)
    out, err = second.communicate(timeout=30)
    assert second.returncode != 0
    assert "OUT_OF_MEMORY" in out + err or "out of memory" in (out + err).lower()


def test_a_launching_worker_is_shown_calling_the_gpu_now(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    """Its last GPU call follows its launches, not only its allocations: a worker that allocated
    at its start and launches at 20 % since is not shown as idle since its start."""
    _create(daemon, "paced", compute=20)
    worker = daemon.workload("paced", "--alloc", "256MiB", "--kernels", "100000")
    workloads.append(worker)
    (seen,) = wait_for(lambda: _workers(daemon, "paced"), timeout=10)
    first = seen["last_gpu_call"]
    assert first is not None

    def later() -> bool:
        (now,) = _workers(daemon, "paced")
        return bool(now["alive"]) and now["last_gpu_call"] >= first + 2.0

    wait_for(later, timeout=20, step=0.2)
    assert worker.poll() is None  # still launching, not done


def test_deleting_a_pod_with_live_workers_needs_force(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    _create(daemon, "busy", memory="2GiB")
    worker = daemon.workload("busy", "--alloc", "256MiB", "--hold", "60")
    workloads.append(worker)
    wait_for(lambda: _workers(daemon, "busy"), timeout=10)
    refused = daemon.cli("pods", "delete", "busy")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: pod default/busy has 1 live worker(s)")
    assert refused.stderr.count("\n") == 1
    forced = daemon.cli("pods", "delete", "busy", "--force")
    assert forced.returncode == 0, forced.stderr
    assert daemon.api("GET", "/api/v1/pods/default/busy").status_code == 404
    assert worker.poll() is None  # the worker itself is left alone


def test_a_refused_delete_keeps_what_the_daemon_holds(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    """Before, the daemon forgot the pod's held limits before it refused the delete: the next
    limits written into the region (a tenant can write its own) stood."""
    _create(daemon, "held", memory="2GiB", compute=30)
    workloads.append(daemon.workload("held", "--alloc", "256MiB", "--hold", "60"))
    wait_for(lambda: _workers(daemon, "held"), timeout=10)
    assert daemon.cli("pods", "delete", "held").returncode == 1
    with open_region(daemon.base / "default" / "held" / "shm") as region:
        region.set_limits(region.devices[0].uuid, 64 * GiB, 9999)
        wait_for(lambda: region.devices[0].compute_limit == 3000, timeout=10)
        assert region.devices[0].memory_limit == 2 * GiB


def test_a_pod_created_over_a_deleted_one_still_running_is_what_was_asked(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    """A pod deleted with force keeps its file while its workers run, and a pod created under
    its name takes the file over. Before, it kept the words the old pod's file held (a compute
    limit of 99.99 % and the critical class written while it was deleted) and its owner,
    whatever the new pod asked: the new owner's programs could not open it, the old ones could."""
    _create(daemon, "again", memory="2GiB", compute=30)
    workloads.append(daemon.workload("again", "--alloc", "256MiB", "--hold", "60"))
    wait_for(lambda: _workers(daemon, "again"), timeout=10)
    assert daemon.cli("pods", "delete", "again", "--force").returncode == 0
    with open_region(daemon.base / "default" / "again" / "shm") as region:
        region.set_limits(region.devices[0].uuid, 64 * GiB, 9999)
        region.set_policy(3, 8)
    other = daemon.cli("pods", "create", "again", "--mem", "0=4GiB", "--owner", "65534")
    assert other.returncode == 1
    assert "was deleted while 1 worker(s) still run, in a file of uid 0" in other.stderr
    created = daemon.cli("pods", "create", "again", "--mem", "0=4GiB", "--json")
    assert created.returncode == 0, created.stderr
    pod = _pod(daemon, "again")
    assert (_gpu0(pod)["memory_limit"], _gpu0(pod)["compute_limit"]) == (4 * GiB, None)
    assert (pod["qos"], pod["weight"]) == ("medium", 2)  # the class's weight


def test_a_pod_created_over_a_deleted_one_on_gpus_it_does_not_ask_is_refused(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    """No entry leaves a region. Before, a pod created for GPU 0 over a pod deleted with force
    on GPUs 0 and 1 took the file over with GPU 1 in it: its programs used GPU 1, which it was
    not given and which the API did not show, and words written there stood (6 GiB allocated
    under the old pod's 2 GiB, after a tenant wrote 64 GiB)."""
    body = {"name": "again", "gpus": {"0": {"memory": "2GiB"}, "1": {"memory": "2GiB"}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    workloads.append(daemon.workload("again", "--alloc", "256MiB", "--hold", "60"))
    wait_for(lambda: _workers(daemon, "again"), timeout=10)
    assert daemon.cli("pods", "delete", "again", "--force").returncode == 0
    with open_region(daemon.base / "default" / "again" / "shm") as region:
        other = region.devices[1].uuid
    one = {"name": "again", "gpus": {"0": {"memory": "4GiB"}}}
    refused = daemon.api("POST", "/api/v1/pods", json=one)
    assert refused.status_code == 409, refused.text
    assert f"in a file that lists GPU {other}: create it with those GPUs too" in refused.text
    both = {"name": "again", "gpus": {"0": {"memory": "4GiB"}, "1": {"memory": "1GiB"}}}
    assert daemon.api("POST", "/api/v1/pods", json=both).status_code == 201
    pod = _pod(daemon, "again")
    assert [gpu["memory_limit"] for gpu in pod["gpus"]] == [4 * GiB, GiB]


def test_a_standalone_limiter_pod_is_adopted(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    worker = daemon.workload("solo", "--alloc", "512MiB", "--hold", "60", namespace="lab")
    workloads.append(worker)
    pod = wait_for(lambda: daemon.http.get("/api/v1/pods/lab/solo").json().get("workers"), 10)
    assert pod == 1
    update = daemon.cli("pods", "update", "lab/solo", "--mem", "0=8GiB", "--json")
    assert update.returncode == 0, update.stderr
    assert _gpu0(json.loads(update.stdout))["memory_limit"] == 8 * GiB


def test_a_restart_loses_nothing(daemon: Daemon, workloads: list[subprocess.Popen[str]]) -> None:
    _create(daemon, "keep", memory="4GiB", compute=50)
    worker = daemon.workload("keep", "--alloc", "1GiB", "--hold", "60")
    workloads.append(worker)
    wait_for(lambda: _gpu0(_pod(daemon, "keep"))["memory_used"] > GiB, timeout=10)
    before = _pod(daemon, "keep")
    token = daemon.token

    assert daemon.stop() == 0
    log = daemon.log_file.read_text()
    assert "SIGTERM received" in log and log.rstrip().endswith("stopped")
    daemon.start()

    after = wait_for(lambda: _pod(daemon, "keep") if _pod(daemon, "keep")["workers"] else None)
    assert _state(after) == _state(before)
    assert daemon.token == token
    (seen,) = _workers(daemon, "keep")
    assert seen["host_pid"] == worker.pid and _gpu0(seen)["memory_used"] == GiB + 512 * MiB


def test_a_corrupt_region_is_that_pods_error_only(daemon: Daemon) -> None:
    _create(daemon, "good", memory="1GiB")
    broken = daemon.base / "default" / "broken" / "shm"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"\x00" * 4096)
    truncated = _create(daemon, "cut", memory="1GiB")
    os.truncate(truncated["path"], 1000)

    def errors() -> dict[str, str | None]:
        return {p["name"]: p["error"] for p in daemon.http.get("/api/v1/pods").json()}

    def both_broken() -> dict[str, str | None] | None:
        found = errors()
        return found if found.get("broken") and found.get("cut") else None

    found = wait_for(both_broken)
    assert found["good"] is None
    assert "bad magic" in (found["broken"] or "") or "too small" in (found["broken"] or "")
    assert "too small" in (found["cut"] or "") or "truncated" in (found["cut"] or "")
    listing = daemon.cli("pods", "list")
    assert listing.returncode == 0 and "default/broken" in listing.stdout
    change = daemon.cli("pods", "update", "broken", "--mem", "0=2GiB")
    assert change.returncode == 1 and "broken" in change.stderr
    assert daemon.cli("pods", "update", "good", "--mem", "0=2GiB").returncode == 0
    metrics = daemon.http.get("/metrics").text
    assert "tf_pod_region_error{Hostname=" in metrics
    assert any('pod="broken"' in line and line.endswith(" 1.0") for line in metrics.splitlines())
    assert daemon.http.get("/readyz").status_code == 200


def _unshare_works() -> bool:
    try:
        probe = subprocess.run(
            ["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="cannot create a pid namespace here")
def test_a_worker_in_another_pid_namespace_gets_its_host_pid(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    _create(daemon, "boxed", memory="2GiB")
    environment = daemon.workload_environment("boxed")
    boxed = subprocess.Popen(
        ["unshare", "--pid", "--fork", WORKLOAD, "--alloc", "256MiB", "--hold", "60"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workloads.append(boxed)
    seen = wait_for(lambda: [w for w in _workers(daemon, "boxed") if w["host_pid"]], timeout=10)
    (worker,) = seen
    assert worker["pid"] == 1  # as it sees itself
    host = psutil.Process(worker["host_pid"])
    assert host.ppid() == boxed.pid and "vgpu-sim-workload" in host.cmdline()[0]
    assert worker["alive"] and "--alloc 256MiB" in worker["command"]
    host.kill()
    wait_for(lambda: _gpu0(_pod(daemon, "boxed"))["memory_used"] == 0, timeout=5)
