"""Allocations refused at a pod's memory limit, through the daemon on the simulated GPU: the
region's count in the API's PodGpu and in /metrics."""

import json

from tests.hypervisor.conftest import Daemon, wait_for

GiB = 1 << 30


def _refusals(daemon: Daemon, pod: str) -> int:
    document = daemon.http.get(f"/api/v1/pods/default/{pod}").json()
    count: int = next(g for g in document["gpus"] if g["index"] == 0)["oom_refusals"]
    return count


def _metric(daemon: Daemon, pod: str) -> float | None:
    for line in daemon.http.get("/metrics").text.splitlines():
        if line.startswith("tf_pod_oom_refusals_total{") and f'pod="{pod}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_refused_allocations_are_counted_in_the_api_and_the_metrics(daemon: Daemon) -> None:
    body = {"name": "small", "gpus": {"0": {"memory": "1GiB"}}}
    created = daemon.api("POST", "/api/v1/pods", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["gpus"][0]["oom_refusals"] == 0
    assert _metric(daemon, "small") == 0

    fits = daemon.workload("small", "--alloc", "256MiB")
    output, _ = fits.communicate(timeout=30)
    assert json.loads(output).get("error") is None
    for count in (1, 2):
        refused = daemon.workload("small", "--alloc", "2GiB")
        output, _ = refused.communicate(timeout=30)
        assert json.loads(output)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
        assert wait_for(lambda: _refusals(daemon, "small") == count)  # noqa: B023 (waited here)
    assert wait_for(lambda: _metric(daemon, "small") == 2)
    # Another pod's count is its own.
    other = daemon.api("POST", "/api/v1/pods", json={"name": "other", "gpus": {"0": {}}})
    assert other.status_code == 201, other.text
    assert _refusals(daemon, "other") == 0
