"""A pod keeps to its GPUs: tf-limiter run --pod shows the program only the pod's GPUs, and the
library refuses contexts on any other GPU of a pod whose region lists its GPUs (every pod the
daemon makes), on the simulated node's two GPUs."""

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from vgpu_limiter.region import create_region, open_region

from tests.hypervisor.conftest import Daemon
from tests.limiter.conftest import WORKLOAD, LimitedEnv, run

GiB = 1 << 30
GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"
GPU1 = "GPU-5157a1e0-0000-4000-8000-000000000002"
TF_LIMITER = str(Path(sys.executable).with_name("tf-limiter"))


def workload(environment: dict[str, str], *options: str) -> dict[str, object]:
    result = run([WORKLOAD, "--kernels", "1", *options], environment)
    report: dict[str, object] = json.loads(result.stdout)
    report["stderr"] = result.stderr
    return report


def daemon_pod(base: Path, name: str = "train") -> Path:
    """A pod as `tf-hypervisor pods create train --mem 0=4GiB` makes it: its region lists GPU 0."""
    path = base / "default" / name / "shm"
    create_region(path, "default", name, {GPU0: (4 * GiB, 0)}).close()
    return path


def pod_environment(limited_env: LimitedEnv, base: Path, **extra: str) -> dict[str, str]:
    environment = limited_env(SHM_BASE_PATH=str(base), POD_NAME="train", **extra)
    environment.pop("SHM_PATH")
    return environment


def pod_gpus(path: Path) -> list[str]:
    with open_region(path, writable=False) as region:
        return [device.uuid for device in region.devices]


def test_the_library_refuses_a_gpu_outside_the_pod(limited_env: LimitedEnv, tmp_path: Path) -> None:
    path = daemon_pod(tmp_path / "base")
    # A program that shows itself more GPUs than the pod's (without CUDA_VISIBLE_DEVICES the
    # library shows it the pod's only: test_cuda_enumerates_only_the_pods_gpus).
    environment = pod_environment(limited_env, tmp_path / "base", CUDA_VISIBLE_DEVICES="0,1")
    outside = workload(environment, "--device", "1", "--alloc", str(20 * GiB))
    assert str(outside["error"]).startswith("CUDA_ERROR_INVALID_DEVICE"), outside
    assert f"device 1 ({GPU1}) is not one of the GPUs of pod default/train" in str(
        outside["stderr"]
    )
    inside = workload(environment, "--device", "0", "--alloc", str(GiB))
    assert inside.get("error") is None, inside
    assert inside["total_bytes"] == 4 * GiB
    # Listings keep showing the pod on its GPU only.
    assert pod_gpus(path) == [GPU0]


def test_cuda_enumerates_only_the_pods_gpus(limited_env: LimitedEnv, tmp_path: Path) -> None:
    """A pod given the node's second GPU, its program setting no CUDA_VISIBLE_DEVICES: the library
    shows CUDA only the pod's GPU, so CUDA ordinal 0 is that GPU (as NVML's index 0 is) and a
    program that counts devices through NVML (PyTorch) uses its own GPU."""
    base = tmp_path / "base"
    path = base / "default" / "train" / "shm"
    create_region(path, "default", "train", {GPU1: (4 * GiB, 0)}).close()
    environment = pod_environment(limited_env, base)
    own = workload(environment, "--device", "0", "--alloc", str(GiB))
    assert own.get("error") is None, own
    # The pod's view of GPU 1 (a context on GPU 0 would have been refused).
    assert own["total_bytes"] == 4 * GiB and own["allocated_bytes"] == GiB
    assert pod_gpus(path) == [GPU1]
    beyond = workload(environment, "--device", "1")
    assert str(beyond["error"]).startswith("CUDA_ERROR_INVALID_DEVICE"), beyond


def test_tf_limiter_run_shows_only_the_pods_gpus(limited_env: LimitedEnv, tmp_path: Path) -> None:
    daemon_pod(tmp_path / "base")
    environment = pod_environment(limited_env, tmp_path / "base", LD_PRELOAD="")
    environment.pop("POD_NAME")
    command = [TF_LIMITER, "run", "--pod", "train", "--", WORKLOAD, "--kernels", "1"]
    # Device 1 does not exist for the program: CUDA_VISIBLE_DEVICES is the pod's GPU.
    result = run([*command, "--device", "1"], environment)
    assert json.loads(result.stdout)["error"].startswith("CUDA_ERROR_INVALID_DEVICE"), result
    seen = json.loads(run([*command, "--device", "0"], environment).stdout)
    assert seen["total_bytes"] == 4 * GiB
    # A CUDA_VISIBLE_DEVICES of the user's own is kept, and the library still refuses GPU 1.
    both = environment | {"CUDA_VISIBLE_DEVICES": "0,1"}
    refused = json.loads(run([*command, "--device", "1", "--alloc", "1GiB"], both).stdout)
    assert refused["error"].startswith("CUDA_ERROR_INVALID_DEVICE"), refused


def test_private_and_unnamed_regions_are_not_confined(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    # SHM_PATH alone (the fixture's pod): every GPU the process sees joins the region.
    environment = limited_env('{"0": "1GiB"}')
    assert workload(environment, "--device", "0").get("error") is None
    assert workload(environment, "--device", "1").get("error") is None
    assert len(pod_gpus(pod_folder / "shm")) == 2
    private = limited_env()
    private.pop("SHM_PATH")
    assert workload(private, "--device", "1").get("error") is None


def test_a_pod_named_by_the_environment_keeps_the_gpus_its_first_process_saw(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    base = tmp_path / "base"
    (base / "default" / "solo").mkdir(parents=True)
    first = limited_env(SHM_BASE_PATH=str(base), POD_NAME="solo", CUDA_VISIBLE_DEVICES="0")
    first.pop("SHM_PATH")
    assert workload(first).get("error") is None
    later = first | {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert str(workload(later, "--device", "1")["error"]).startswith("CUDA_ERROR_INVALID_DEVICE")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """The node daemon on a simulated node of two GPUs (as tests/hypervisor start it)."""
    running = Daemon(tmp_path / "node")
    running.root.mkdir()
    running.start()
    try:
        yield running
    finally:
        running.close()


def test_the_issue_scenario_with_the_daemon(daemon: Daemon) -> None:
    # pods create train --mem 0=4GiB, then tf-limiter run --pod train: nothing on GPU 1.
    created = daemon.cli("pods", "create", "train", "--mem", "0=4GiB")
    assert created.returncode == 0, created.stderr
    environment = daemon.workload_environment("train", LD_PRELOAD="")
    for name in ("POD_NAME", "POD_NAMESPACE"):
        environment.pop(name)
    command = [TF_LIMITER, "run", "--pod", "train", "--", WORKLOAD, "--kernels", "1"]
    on_gpu1 = json.loads(run([*command, "--device", "1", "--alloc", "20GiB"], environment).stdout)
    assert on_gpu1["error"].startswith("CUDA_ERROR_INVALID_DEVICE"), on_gpu1
    # Even with both GPUs made visible, the library refuses GPU 1.
    both = environment | {"CUDA_VISIBLE_DEVICES": "0,1"}
    refused = json.loads(run([*command, "--device", "1", "--alloc", "20GiB"], both).stdout)
    assert refused["error"].startswith("CUDA_ERROR_INVALID_DEVICE"), refused
    on_gpu0 = json.loads(run([*command, "--device", "0", "--alloc", "1GiB"], both).stdout)
    assert on_gpu0.get("error") is None, on_gpu0
    assert on_gpu0["total_bytes"] == 4 * GiB
    # The pod is listed on its GPU only.
    listed = daemon.api("GET", "/api/v1/pods/default/train")
    assert listed.status_code == 200, listed.text
    assert [gpu["uuid"].lower() for gpu in listed.json()["gpus"]] == [GPU0.lower()]


def test_a_limit_for_a_gpu_outside_the_pod_is_named_in_the_log(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    path = daemon_pod(tmp_path / "base")
    environment = pod_environment(
        limited_env, tmp_path / "base", TENSOR_FUSION_CUDA_MEM_LIMIT=f'{{"{GPU1}": "1GiB"}}'
    )
    result = workload(environment, "--device", "0", "--alloc", str(GiB))
    assert result.get("error") is None, result
    assert f"({GPU1}) is not one of the GPUs of pod default/train" in str(result["stderr"])
    assert pod_gpus(path) == [GPU0]


NVML_LISTING = """
import ctypes, json, os, pynvml, threading
pynvml.nvmlInit()
def count():
    number = ctypes.c_uint()
    assert pynvml._nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")(ctypes.byref(number)) == 0
    return number.value
# The first calls race from eight threads; a forked child counts again on its own.
counts = []
threads = [threading.Thread(target=lambda: counts.append(count())) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
child = os.fork()
if child == 0:
    os._exit(count())
child_count = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
def listing(count, handle):
    number = ctypes.c_uint()
    assert pynvml._nvmlGetFunctionPointer(count)(ctypes.byref(number)) == 0
    gpus = []
    for index in range(number.value + 1):
        device = pynvml.c_nvmlDevice_t()
        result = pynvml._nvmlGetFunctionPointer(handle)(index, ctypes.byref(device))
        if index == number.value:
            assert result == pynvml.NVML_ERROR_INVALID_ARGUMENT, result
            break
        assert result == 0, result
        gpus.append({
            "uuid": pynvml.nvmlDeviceGetUUID(device),
            "total": pynvml.nvmlDeviceGetMemoryInfo(device).total,
            "index": pynvml.nvmlDeviceGetIndex(device),
        })
    return gpus
outside = pynvml.nvmlDeviceGetHandleByUUID("OUTSIDE")
print(json.dumps({
    "v2": listing("nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"),
    "v1": listing("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"),
    "by_uuid": pynvml.nvmlDeviceGetUUID(outside),
    "counts": sorted(set(counts)) + [child_count],
}))
""".replace("OUTSIDE", GPU0)


class NvmlListing(TypedDict):
    v1: list[dict[str, Any]]  # uuid and total of each GPU, by its index
    v2: list[dict[str, Any]]
    by_uuid: str
    counts: list[int]  # the distinct counts eight racing threads saw, then a forked child's


def nvml_gpus(environment: dict[str, str]) -> NvmlListing:
    result = run([sys.executable, "-c", NVML_LISTING], environment)
    assert result.returncode == 0, result.stderr
    listed: NvmlListing = json.loads(result.stdout)
    assert listed["v1"] == listed["v2"]
    assert listed["counts"] == [len(listed["v2"])] * 2
    assert [gpu["index"] for gpu in listed["v2"]] == list(range(len(listed["v2"])))
    return listed


def test_nvml_lists_only_the_pods_gpus(limited_env: LimitedEnv, tmp_path: Path) -> None:
    base = tmp_path / "base"
    path = base / "default" / "train" / "shm"
    create_region(path, "default", "train", {GPU1: (4 * GiB, 0)}).close()
    confined = nvml_gpus(pod_environment(limited_env, base))
    # One GPU, GPU 1, with the pod's memory view; index 1 is past the count.
    assert confined["v2"] == [{"uuid": GPU1, "total": 4 * GiB, "index": 0}]
    # A GPU outside the pod is not listed, but a handle by UUID is left alone.
    assert confined["by_uuid"] == GPU0


def test_nvml_lists_every_gpu_outside_a_confined_pod(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    without = nvml_gpus(limited_env(preload=False))
    assert [gpu["uuid"] for gpu in without["v2"]] == [GPU0, GPU1]
    # SHM_PATH alone, a private region, and a named pod whose region lists no GPU yet.
    unnamed = limited_env('{"0": "1GiB"}')
    private = limited_env()
    private.pop("SHM_PATH")
    (tmp_path / "base" / "default" / "solo").mkdir(parents=True)
    solo = pod_environment(limited_env, tmp_path / "base") | {"POD_NAME": "solo"}
    for environment in (unnamed, private, solo):
        listed = nvml_gpus(environment)
        assert [gpu["uuid"] for gpu in listed["v2"]] == [GPU0, GPU1]
    assert nvml_gpus(unnamed)["v2"][0]["total"] == GiB
