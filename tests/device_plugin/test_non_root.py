"""A container that does not run as root uses the region bound to its allocation: the region
belongs to the pod's runAsUser (or its fsGroup), the pod folder and the container's allocation
folder stay the daemon's. The
workload runs as a real unprivileged user (`nobody`) with exactly the env and mounts Allocate
returned, its container paths mapped onto the host paths of its mounts."""

import dataclasses
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_hypervisor.kubernetes.model import UserGroup

from tests.device_plugin.conftest import (
    GiB,
    Node,
    admit,
    allocation_of,
    gpu_pod,
    running_node,
    serving,
)
from tests.hypervisor.conftest import clean_environment
from tests.support.tenant import NOBODY, TenantTools, needs_root, tenant_tools

pytestmark = needs_root
FS_GROUP = 4242  # a group nobody is in but as the pod's fsGroup


@pytest.fixture
def tools() -> Iterator[TenantTools]:
    with tenant_tools() as made:
        yield made


@pytest.fixture
def readable_node(
    tools: TenantTools, snapshot: NodeSnapshot, sim_state: Path
) -> Iterator[tuple[Node, Path]]:
    """A node whose every file the tenant can reach (pytest's folders are root's alone), with a
    copy of the simulated GPUs' state that every process may write, as the device files."""
    state = tools.root / "node" / "node.state"
    shutil.copy(sim_state, state)
    state.chmod(0o666)
    with running_node(tools.root / "node", snapshot) as node:
        yield node, state


def _as_tenant(
    tools: TenantTools,
    answer: api_pb2.ContainerAllocateResponse,
    state: Path,
    size: str,
    groups: Sequence[int],
) -> dict[str, object]:
    """The workload as nobody with Allocate's env (container paths as the mounts map them);
    ``groups``: its supplementary groups (the runtime gives every container the fsGroup)."""
    mounts = sorted(((m.container_path, m.host_path) for m in answer.mounts), key=len, reverse=True)

    def on_host(value: str) -> str:
        for inside, host in mounts:
            value = value.replace(inside, host)
        return value

    # The simulated GPU's libraries from the readable copies; then Allocate's env, untouched.
    environment = tools.environment(clean_environment() | {"VGPU_SIM_STATE": str(state)})
    environment |= {name: on_host(value) for name, value in answer.envs.items()}
    workload = tools.run_as_tenant(
        [str(tools.workload), "--kernels", "1", "--alloc", size], environment, groups
    )
    stdout, stderr = workload.communicate(timeout=60)
    assert stdout, stderr
    report: dict[str, object] = json.loads(stdout)
    report["stderr"] = stderr
    return report


@pytest.mark.parametrize(
    "case",
    [
        (UserGroup(NOBODY, NOBODY), None, [], (NOBODY, NOBODY)),  # runAsUser
        (UserGroup(), FS_GROUP, [FS_GROUP], (0, FS_GROUP)),  # fsGroup alone: the image's user
    ],
    ids=["run-as-user", "fs-group"],
)
def test_a_non_root_container_runs_under_its_limit_with_exactly_allocates_answer(
    readable_node: tuple[Node, Path],
    snapshot: NodeSnapshot,
    tools: TenantTools,
    case: tuple[UserGroup, int | None, list[int], tuple[int, int]],
) -> None:
    pod_ids, fs_group, groups, owner = case
    node, state = readable_node
    tenant = gpu_pod("tenant", 1, "2026-01-01T00:00:00Z", memory=2, compute=40)
    with serving(node, snapshot) as plugin:
        pod = dataclasses.replace(tenant, run_as=pod_ids, fs_group=fs_group)
        answer = admit(node, plugin, pod)["main"]
        folder = plugin.bindings.path(allocation_of(plugin, answer).id)

    region = node.layout.host_base / "team" / "tenant" / "shm"
    info, pod_folder = region.stat(), region.parent.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (*owner, 0o660)
    assert (pod_folder.st_uid, pod_folder.st_mode & 0o777) == (0, 0o755)  # not replaceable
    assert (folder / "shm").stat().st_ino == info.st_ino  # the container's folder holds it

    fits = _as_tenant(tools, answer, state, "1GiB", groups)
    assert fits.get("error") is None, fits
    assert fits["total_bytes"] == 2 * GiB  # the region's limit, seen as the GPU's memory
    refused = _as_tenant(tools, answer, state, "3GiB", groups)
    assert refused["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", refused
