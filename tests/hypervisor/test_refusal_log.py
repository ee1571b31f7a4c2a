"""A refused allocation is told on bare metal too: the daemon's log says which pod, GPU and limit
(at most once a minute per pod), where before only a counter moved."""

import json
import subprocess

from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.refusals import QUIET_S, RefusalLog

from tests.hypervisor.conftest import Daemon, wait_for


def test_the_daemon_logs_a_pods_refused_allocations(
    daemon: Daemon, workloads: list["subprocess.Popen[str]"]
) -> None:
    created = daemon.cli("pods", "create", "small", "--mem", "0=1GiB")
    assert created.returncode == 0, created.stderr
    process = daemon.workload("small", "--kernels", "1", "--alloc", "700MiB")
    workloads.append(process)
    out, _ = process.communicate(timeout=60)
    assert json.loads(out)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"
    wait_for(lambda: "refused on GPU 0" in daemon.log_file.read_text(), timeout=10)
    (said,) = [line for line in daemon.log_file.read_text().splitlines() if "refused" in line]
    assert "pod default/small: an allocation refused on GPU 0" in said
    assert "past its memory limit of 1 GiB; the last asked for 700 MiB" in said


def test_a_pods_refusals_are_logged_once_a_minute_at_most() -> None:
    now = [100.0]
    tell = RefusalLog(clock=lambda: now[0])
    pod = models.Pod(
        namespace="a", name="b", path="/x", created=None, error=None, gpus=[], workers=0
    )
    other = models.Pod(
        namespace="a", name="c", path="/y", created=None, error=None, gpus=[], workers=0
    )
    assert tell(pod, "first")
    now[0] += QUIET_S / 2
    assert not tell(pod, "too soon: told with the next")
    assert tell(other, "another pod is told at once")
    now[0] += QUIET_S / 2 + 1
    assert tell(pod, "a minute on")
