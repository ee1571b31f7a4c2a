"""Memory oversubscription through the daemon on the simulated GPU: the API field and the CLI
flags, and a worker's device-resident and host-backed bytes shown apart in the API, the tables
and /metrics, and given back when it dies."""

import json
import re
import signal
import subprocess
from typing import Any

from rich.console import Console
from vgpu_hypervisor.client.tables import pod_table

from tests.hypervisor.conftest import Daemon, wait_for

GiB = 1 << 30
MiB = 1 << 20


def _gpu0(daemon: Daemon, pod: str) -> dict[str, Any]:
    document = daemon.http.get(f"/api/v1/pods/default/{pod}").json()
    gpu: dict[str, Any] = next(g for g in document["gpus"] if g["index"] == 0)
    return gpu


def _metric(daemon: Daemon, name: str, pod: str) -> float | None:
    for line in daemon.http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and f'pod="{pod}"' in line and 'gpu="0"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_an_oversubscribed_worker_is_shown_on_the_device_and_in_host_memory(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    body = {"name": "big", "gpus": {"0": {"memory": "1GiB", "oversubscribe": True}}}
    created = daemon.api("POST", "/api/v1/pods", json=body)
    assert created.status_code == 201, created.text
    (gpu,) = created.json()["gpus"]
    assert (gpu["oversubscribe"], gpu["memory_used"], gpu["host_memory_used"]) == (True, 0, 0)

    worker = daemon.workload("big", "--alloc", "2GiB", "--hold", "60")
    workloads.append(worker)
    assert worker.stdout is not None
    assert json.loads(worker.stdout.readline()).get("error") is None
    gpu = wait_for(lambda: (g := _gpu0(daemon, "big"))["host_memory_used"] == 2 * GiB and g)
    assert gpu["memory_used"] == 512 * MiB  # the context; the 2 GiB are in host memory
    (seen,) = daemon.http.get("/api/v1/workers", params={"pod": "big"}).json()
    (worker_gpu,) = [g for g in seen["gpus"] if g["host_memory_used"]]
    assert (worker_gpu["memory_used"], worker_gpu["host_memory_used"]) == (512 * MiB, 2 * GiB)
    assert _metric(daemon, "tf_pod_host_memory_bytes", "big") == 2 * GiB
    assert _metric(daemon, "tf_pod_memory_used_bytes", "big") == 512 * MiB
    listing = daemon.cli("pods", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    console = Console(width=200, record=True)
    console.print(pod_table(json.loads(listing.stdout), width=200))
    assert re.search(r"512.0 MiB / 1.0 GiB .* 2.0 GiB ", console.export_text())

    # Off again: what is held stays where it is, the next allocation past the limit fails.
    changed = daemon.api(
        "PATCH", "/api/v1/pods/default/big", json={"gpus": {"0": {"oversubscribe": False}}}
    )
    assert changed.status_code == 200, changed.text
    gpu = next(g for g in changed.json()["gpus"] if g["index"] == 0)
    assert (gpu["oversubscribe"], gpu["memory_limit"], gpu["host_memory_used"]) == (
        False,
        GiB,
        2 * GiB,
    )
    refused = daemon.workload("big", "--alloc", "1GiB")
    output, _ = refused.communicate(timeout=30)
    assert json.loads(output)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"

    worker.send_signal(signal.SIGKILL)
    worker.wait()
    wait_for(lambda: _gpu0(daemon, "big")["host_memory_used"] == 0, timeout=5)
    assert _gpu0(daemon, "big")["memory_used"] == 0


def test_the_cli_turns_oversubscription_on_and_off(daemon: Daemon) -> None:
    created = daemon.cli(
        "pods", "create", "over", "--mem", "0=2GiB", "--oversubscribe", "0", "--json"
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["gpus"][0]["oversubscribe"] is True
    # Another limit changed alone leaves the flag as it is.
    kept = daemon.cli("pods", "update", "over", "--mem", "0=3GiB", "--json")
    assert json.loads(kept.stdout)["gpus"][0]["oversubscribe"] is True
    off = daemon.cli("pods", "update", "over", "--no-oversubscribe", "0", "--json")
    assert off.returncode == 0, off.stderr
    gpu = json.loads(off.stdout)["gpus"][0]
    assert (gpu["oversubscribe"], gpu["memory_limit"]) == (False, 3 * GiB)


def test_bad_oversubscription_requests_get_one_line_errors(daemon: Daemon) -> None:
    flag = daemon.cli("pods", "create", "bad", "--oversubscribe", "0=yes")
    assert flag.returncode != 0
    assert "--oversubscribe '0=yes': expected a GPU index or UUID" in flag.stderr
    assert len(flag.stderr.strip().splitlines()) == 1
    both = daemon.cli(
        "pods", "create", "bad", "--mem", "0=1GiB", "--oversubscribe", "0", "--oversubscribe", "0"
    )
    assert both.returncode != 0 and "GPU 0 given twice" in both.stderr
    body = {"name": "bad", "gpus": {"0": {"memory": "1GiB", "oversubscribe": "yes"}}}
    reply = daemon.api("POST", "/api/v1/pods", json=body)
    assert reply.status_code == 422
    assert "oversubscribe" in reply.json()["error"]
