"""TF_REGION_REQUIRED (set by the device plugin's Allocate): the node daemon made the pod's
region, and the container's environment carries no limits, so a process that finds the region
missing (removed, or a node rebooted under a container) fails CUDA's initialization rather
than make one with no limit; where the region exists its limits are the truth."""

import json
import subprocess
import time
from pathlib import Path

import pytest
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.daemon.pods import PodStore

from tests.limiter.conftest import WORKLOAD, LimitedEnv, build_program, run
from tests.limiter.test_config import check_config, config_of, error_of

GiB = 1 << 30
UUID0 = "GPU-5157a1e0-0000-4000-8000-000000000001"  # the simulated GPU 0


@pytest.mark.parametrize(("value", "required"), [("1", True), ("TRUE", True), ("0", False)])
def test_the_variable_reads_as_a_switch(value: str, required: bool) -> None:
    config = config_of({"TF_REGION_REQUIRED": value, "SHM_PATH": "/pods/a"})
    assert config.pod.region_required is required


def test_check_config_shows_it() -> None:
    result = check_config(TF_REGION_REQUIRED="1", SHM_PATH="/pods/a", COLUMNS="200")
    assert result.returncode == 0, result.stderr
    assert "required: the node daemon's, never made here" in result.stdout
    assert "TF_REGION_REQUIRED" in result.stdout


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"TF_REGION_REQUIRED": "yes", "SHM_PATH": "/pods/a"}, "expected 1 or true, 0 or false"),
        ({"TF_REGION_REQUIRED": "1"}, "names no pod region: SHM_PATH or POD_NAME is unset"),
    ],
)
def test_a_bad_value_or_no_pod_is_an_error_naming_it(values: dict[str, str], problem: str) -> None:
    assert error_of(values) == f"TF_REGION_REQUIRED={values['TF_REGION_REQUIRED']}: {problem}"


def test_a_missing_region_fails_cuda_and_none_is_made(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    """Root or not, with the pod folder there (a runtime makes a missing mount source) or
    not: no region of the process's own making, which would hold no limit."""
    environment = limited_env(TF_REGION_REQUIRED="1")
    for folder_there in (False, True):
        if folder_there:
            pod_folder.mkdir(mode=0o755)
        result = run([WORKLOAD, "--kernels", "1", "--alloc", "1GiB"], environment)
        assert result.returncode != 0
        assert json.loads(result.stdout)["error"].startswith("CUDA_ERROR_NOT_INITIALIZED")
        (line,) = [one for one in result.stderr.splitlines() if "TF_REGION_REQUIRED" in one]
        assert f"{pod_folder}/shm: no such pod region" in line
        assert "the node daemon makes the pod's region before its containers start" in line
        assert not (pod_folder / "shm").exists()

    # Without the variable, the limiter makes a region of its own as it always did.
    made = run([WORKLOAD, "--kernels", "1"], limited_env())
    assert made.returncode == 0, made.stderr
    assert (pod_folder / "shm").exists()


def test_a_region_the_daemon_made_is_used_as_it_is(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    store = PodStore(pod_folder.parent / "base")
    try:
        store.create("team", "p", {UUID0: GpuLimits(memory=2 * GiB)})
        folder = store.get("team", "p").path.parent
        environment = limited_env(TF_REGION_REQUIRED="1", SHM_PATH=str(folder))
        fits = run([WORKLOAD, "--kernels", "1", "--alloc", "1GiB"], environment)
        assert fits.returncode == 0, fits.stderr
        assert json.loads(fits.stdout)["total_bytes"] == 2 * GiB
        too_much = run([WORKLOAD, "--kernels", "1", "--alloc", "2GiB"], environment)
        assert json.loads(too_much.stdout)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
    finally:
        store.close()


@pytest.mark.parametrize("value", ["soon", "-1", "3601", "1.5"])
def test_a_bad_wait_is_an_error_naming_it(value: str) -> None:
    values = {"TF_REGION_REQUIRED": "1", "SHM_PATH": "/pods/a", "TF_REGION_WAIT": value}
    assert error_of(values) == (
        f"TF_REGION_WAIT={value}: expected a whole number of seconds, 0 to 3600"
    )


def test_a_region_that_comes_late_is_waited_for(limited_env: LimitedEnv, pod_folder: Path) -> None:
    """The device plugin's folder gets its region once the daemon has bound the container to
    its pod: a process started before that waits (TF_REGION_WAIT) and then runs under it."""
    store = PodStore(pod_folder.parent / "base")
    try:
        folder = store.base / "team" / "late"
        environment = limited_env(TF_REGION_REQUIRED="1", TF_REGION_WAIT="60", SHM_PATH=str(folder))
        workload = subprocess.Popen(
            [WORKLOAD, "--kernels", "1", "--alloc", "3GiB"],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)  # it is waiting (or not started yet): either way the region comes later
        assert workload.poll() is None
        store.create("team", "late", {UUID0: GpuLimits(memory=2 * GiB)})
        stdout, stderr = workload.communicate(timeout=60)
        assert json.loads(stdout)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", stderr
    finally:
        store.close()


def test_a_region_that_never_comes_is_one_line_after_the_wait(
    limited_env: LimitedEnv, pod_folder: Path
) -> None:
    pod_folder.mkdir(mode=0o755)
    environment = limited_env(TF_REGION_REQUIRED="1", TF_REGION_WAIT="1")
    started = time.monotonic()
    result = run([WORKLOAD, "--kernels", "1", "--alloc", "1GiB"], environment)
    assert time.monotonic() - started >= 1
    assert json.loads(result.stdout)["error"].startswith("CUDA_ERROR_NOT_INITIALIZED")
    (line,) = [one for one in result.stderr.splitlines() if "TF_REGION_WAIT" in one]
    assert line.endswith(
        f"{pod_folder}/shm: no pod region after 1 s: the node daemon has not bound this "
        "container's GPUs to its pod (TF_REGION_WAIT=1; is tf-hypervisor running, and can it "
        "reach the kubelet's PodResources socket?)"
    )
    assert not (pod_folder / "shm").exists()


def test_a_fork_while_a_thread_waits_for_the_region_hangs_neither(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    """The wait runs in the limiter's one-time setup: a child forked meanwhile sets up afresh
    (and waits in turn) rather than wait for ever on its parent's setup."""
    program = build_program("limiter_fork_wait", tmp_path)
    store = PodStore(tmp_path / "base")
    try:
        folder = store.base / "team" / "forked"
        environment = limited_env(TF_REGION_REQUIRED="1", TF_REGION_WAIT="60", SHM_PATH=str(folder))
        process = subprocess.Popen(
            [str(program)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.6)  # forked by then, both waiting (or, on a slow machine, not yet: no matter)
        store.create("team", "forked", {UUID0: GpuLimits(memory=2 * GiB)})
        stdout, stderr = process.communicate(timeout=60)
        assert json.loads(stdout) == {"thread": 0, "child": 0}, stderr
    finally:
        store.close()
