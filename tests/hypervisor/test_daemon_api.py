"""The daemon's HTTP API against a live daemon on the simulated GPU."""

import json
import stat

import pytest
from vgpu_limiter.region import open_region

from tests.hypervisor.conftest import Daemon

GiB = 1 << 30


def test_health_readiness_status_and_gpus(daemon: Daemon) -> None:
    assert daemon.http.get("/healthz").json() == {"status": "ok"}
    ready = daemon.http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {
        "nvml": "ok",
        "shm_base_path": "ok",
        "free_space": "ok",
        "tasks": "ok",
    }
    status = daemon.http.get("/api/v1/status").json()
    assert status["backend"] == "simulated"
    assert status["gpus"] == 2 and status["pods"] == 0 and status["ready"] is True
    gpus = daemon.http.get("/api/v1/gpus").json()
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    assert all(gpu["memory_total"] == 80 * GiB and gpu["uuid"].startswith("GPU-") for gpu in gpus)
    assert daemon.http.get("/openapi.json").json()["info"]["title"] == "tf-hypervisor"


def test_the_first_log_line_names_the_backend_and_the_token_is_private(daemon: Daemon) -> None:
    first = daemon.log_file.read_text().splitlines()[0]
    assert "GPU backend: simulated GPU (requested): 2 devices" in first
    assert stat.S_IMODE(daemon.token_file.stat().st_mode) == 0o600
    assert len(daemon.token) >= 32


def test_pod_lifecycle(daemon: Daemon) -> None:
    body = {"name": "train", "gpus": {"0": {"memory": "4GiB", "compute": 30}}}
    created = daemon.api("POST", "/api/v1/pods", json=body)
    assert created.status_code == 201, created.text
    pod = created.json()
    assert (pod["namespace"], pod["name"], pod["error"], pod["workers"]) == (
        "default",
        "train",
        None,
        0,
    )
    (gpu,) = pod["gpus"]
    assert (gpu["index"], gpu["memory_limit"], gpu["compute_limit"]) == (0, 4 * GiB, 30.0)
    assert (daemon.base / "default" / "train" / "shm").is_file()

    listed = daemon.http.get("/api/v1/pods").json()
    assert [p["name"] for p in listed] == ["train"]
    assert daemon.http.get("/api/v1/pods/default/train").json() == pod

    uuid1 = daemon.http.get("/api/v1/gpus").json()[1]["uuid"]
    changed = daemon.api(
        "PATCH",
        "/api/v1/pods/default/train",
        json={"gpus": {"0": {"compute": "100"}, uuid1: {"memory": 2 * GiB}}},
    )
    assert changed.status_code == 200, changed.text
    gpus = {g["index"]: g for g in changed.json()["gpus"]}
    assert gpus[0]["memory_limit"] == 4 * GiB and gpus[0]["compute_limit"] is None
    assert gpus[1]["memory_limit"] == 2 * GiB

    deleted = daemon.api("DELETE", "/api/v1/pods/default/train")
    assert deleted.status_code == 200
    assert not (daemon.base / "default").exists()
    assert daemon.http.get("/api/v1/pods/default/train").status_code == 404


def test_changes_need_the_token(daemon: Daemon) -> None:
    body = {"name": "p", "gpus": {"0": {"memory": "1GiB"}}}
    missing = daemon.api("POST", "/api/v1/pods", auth=False, json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "token" in missing.json()["error"]
    wrong = daemon.http.post("/api/v1/pods", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json() == {"error": "wrong API token"}
    assert daemon.http.get("/api/v1/pods").json() == []


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ("{not json", 422, "not valid JSON"),
        ({"name": "p"}, 422, "gpus"),
        ({"name": "p", "gpus": {}}, 422, "gpus"),
        ({"name": "../x", "gpus": {"0": {}}}, 422, "name"),
        ({"name": "p", "gpus": {"7": {"memory": "1GiB"}}}, 422, "no such GPU"),
        ({"name": "p", "gpus": {"zero": {"memory": "1GiB"}}}, 422, "gpus: bad GPU key 'zero'"),
        ({"name": "p", "gpus": {"GPU-nope": {}}}, 422, "gpus: bad GPU key 'GPU-nope'"),
        ({"name": "p", "gpus": {"0": {"memory": "lots"}}}, 422, "gpus.0.memory"),
        ({"name": "p", "gpus": {"0": {"memory": "1000GiB"}}}, 422, "gpus.0.memory: 1000 GiB is"),
        ({"name": "p", "gpus": {"0": {"compute": 0}}}, 422, "gpus.0.compute: expected a percent"),
        ({"name": "p", "gpus": {"0": {"compute": 101}}}, 422, "0.01 to 100"),
        ({"name": "p", "gpus": {"0": {"compute": "NaN"}}}, 422, "0.01 to 100"),
        ({"name": "p", "gpus": {"0": {"compute": 12.345}}}, 422, "at most two decimals"),
        ({"name": "p", "gpus": {"0": {"burst": 50}}}, 422, "burst 50 % needs a compute limit"),
        ({"name": "p", "gpus": {"0": {"oversubscribe": True}}}, 422, "needs a memory limit"),
        ({"name": "p", "gpus": {"0": {}}, "extra": 1}, 422, "extra"),
        ([], 422, "body"),
    ],
)
def test_bad_requests_get_one_line_errors(
    daemon: Daemon, body: object, status: int, words: str
) -> None:
    if isinstance(body, str):
        reply = daemon.api(
            "POST", "/api/v1/pods", content=body, headers={"Content-Type": "application/json"}
        )
    else:
        reply = daemon.api("POST", "/api/v1/pods", json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert words in error and "\n" not in error
    assert daemon.http.get("/api/v1/pods").json() == []


def test_a_change_refused_for_one_gpu_changes_no_other(daemon: Daemon) -> None:
    """Before, the GPUs named ahead of the refused one were written, and the request answered
    422: an admin read "nothing changed" while GPU 0 went to 8 GiB and 90 %."""
    gpus = {"0": {"memory": "2GiB", "compute": 30}, "1": {"memory": "2GiB"}}
    assert daemon.api("POST", "/api/v1/pods", json={"name": "p", "gpus": gpus}).status_code == 201
    change = {"gpus": {"0": {"memory": "8GiB", "compute": 90}, "1": {"burst": 50}}}
    reply = daemon.api("PATCH", "/api/v1/pods/default/p", json=change)
    assert reply.status_code == 422 and "burst 50 % needs a compute limit" in reply.text
    with open_region(daemon.base / "default" / "p" / "shm", writable=False) as region:
        written = [(device.memory_limit, device.compute_limit) for device in region.devices]
    assert written == [(2 * GiB, 3000), (2 * GiB, 0)]


def test_not_found_and_wrong_methods_are_json(daemon: Daemon) -> None:
    for method, path, status in [
        ("GET", "/nowhere", 404),
        ("GET", "/api/v1/pods/default/none", 404),
        ("PATCH", "/api/v1/pods/default/none", 404),
        ("DELETE", "/api/v1/pods/default/none", 404),
        ("PUT", "/api/v1/pods", 405),
        ("GET", "/api/v1/pods/bad%20name/x", 422),
    ]:
        body = {"gpus": {"0": {"memory": "1GiB"}}} if method == "PATCH" else None
        reply = daemon.api(method, path, json=body)
        assert reply.status_code == status, (method, path, reply.text)
        assert set(reply.json()) == {"error"}


def test_a_pod_is_never_recreated(daemon: Daemon) -> None:
    body = {"name": "once", "gpus": {"0": {"memory": "1GiB"}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    again = daemon.api("POST", "/api/v1/pods", json=body | {"gpus": {"0": {"memory": "2GiB"}}})
    assert again.status_code == 409
    assert again.json() == {"error": "pod default/once already exists"}
    pod = daemon.http.get("/api/v1/pods/default/once").json()
    assert pod["gpus"][0]["memory_limit"] == 1 << 30


def test_metrics_exposition(daemon: Daemon) -> None:
    body = {"name": "m", "namespace": "team", "gpus": {"1": {"memory": "3GiB", "compute": 25}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    reply = daemon.http.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    lines = reply.text.splitlines()
    limit = [line for line in lines if line.startswith("tf_pod_memory_limit_bytes{")]
    assert len(limit) == 1 and 'namespace="team"' in limit[0] and 'gpu="1"' in limit[0]
    assert limit[0].endswith(f" {float(3 << 30)!r}") or limit[0].endswith(" 3.221225472e+09")
    assert any(
        line.startswith("tf_pod_compute_limit_percent{") and line.endswith(" 25.0")
        for line in lines
    )
    assert sum(line.startswith("tf_gpu_memory_total_bytes{") for line in lines) == 2
    assert any(line.startswith("tf_pod_region_error{") and line.endswith(" 0.0") for line in lines)


def test_influx_file(daemon: Daemon) -> None:
    body = {"name": "w", "gpus": {"0": {"memory": "1GiB"}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201

    def worker_line() -> str | None:
        if not daemon.metrics_file.exists():
            return None
        lines = daemon.metrics_file.read_text().splitlines()
        return next((line for line in lines if line.startswith("tf_worker_usage,")), None)

    from tests.hypervisor.conftest import wait_for

    line = wait_for(worker_line, timeout=5)
    measurement, _, rest = line.partition(" ")
    tags = dict(pair.split("=", 1) for pair in measurement.split(",")[1:])
    assert (
        tags["worker"] == "w" and tags["namespace"] == "default" and tags["uuid"].startswith("GPU-")
    )
    fields, _, timestamp = rest.partition(" ")
    assert "memory_bytes=0i" in fields.split(",")
    assert int(timestamp) > 1_600_000_000 * 10**9
    gpu_lines = [
        entry
        for entry in daemon.metrics_file.read_text().splitlines()
        if entry.startswith("tf_gpu_usage,")
    ]
    assert gpu_lines and all("memory_bytes=" in entry for entry in gpu_lines)
    json.dumps(gpu_lines)
