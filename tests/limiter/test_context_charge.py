"""The context charge as a node setting: the daemon publishes it in every GPU's node file, and a
context is charged the larger of that and the process's own TF_CUDA_CONTEXT_OVERHEAD. Before, a
tenant of the daemon's own user (a container running as root, in Kubernetes) could set the
variable to 0 and hold contexts its limit never counted."""

import json
import subprocess
from pathlib import Path

import pytest
from vgpu_limiter.lease import DeviceLease
from vgpu_limiter.region import open_region

from tests.limiter.conftest import WORKLOAD, LimitedEnv
from tests.limiter.test_compute_limits import SIM_GPU0

MiB = 1 << 20
GiB = 1 << 30


def _charged(environment: dict[str, str], pod_folder: Path) -> int:
    """What the pod's region counts while one process holds 64 MiB in one context."""
    holder = subprocess.Popen(
        [WORKLOAD, "--alloc", "64MiB", "--kernels", "1", "--hold", "30"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line, holder.communicate(timeout=30)[1]
        assert json.loads(line).get("error") is None, line
        with open_region(pod_folder / "shm", writable=False) as region:
            return int(region.devices[0].memory_used) - 64 * MiB
    finally:
        holder.kill()
        holder.communicate(timeout=30)


@pytest.mark.parametrize(
    "case",
    [
        (None, "0", 0),  # no daemon: a pod of one's own may lower it
        (GiB, "0", GiB),  # the node's charge holds against a lower value
        (256 * MiB, "512MiB", 512 * MiB),  # a process may raise it
        (0, "0", 0),  # a daemon that publishes none leaves the process's
    ],
)
def test_a_context_is_charged_the_larger_of_the_nodes_and_its_own(
    limited_env: LimitedEnv, pod_folder: Path, tmp_path: Path, case: tuple[int | None, str, int]
) -> None:
    node, own, expected = case
    base = tmp_path / "base"
    if node is not None:
        with DeviceLease.open(base, SIM_GPU0) as lease:
            lease.publish_context_charge(node)
            assert lease.context_charge() == node
    environment = limited_env(
        '{"0": "4GiB"}', SHM_BASE_PATH=str(base), TF_CUDA_CONTEXT_OVERHEAD=own
    )
    assert _charged(environment, pod_folder) == expected


def test_a_negative_charge_is_refused(tmp_path: Path) -> None:
    with (
        DeviceLease.open(tmp_path / "base", SIM_GPU0) as lease,
        pytest.raises(ValueError, match="cannot be negative"),
    ):
        lease.publish_context_charge(-1)
