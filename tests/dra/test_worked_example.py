"""docs/dra.md's worked example, run: its kubectl commands (real kubectl) against the
API-server stand-in, the driver's slice of the simulated node published, the example pod
scheduled by the stand-in for the scheduler and its claim prepared by the stand-in kubelet
over real gRPC; the claim's status read back with kubectl."""

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.dra.inventory import NodeFacts
from vgpu_hypervisor.dra.kube import open_client
from vgpu_hypervisor.dra.publish import SlicePublisher

from tests.dra.allocator import Scheduler
from tests.dra.conftest import NODE, DraNode, GiB
from tests.dra.kubelet import Plugin, stop_pod
from tests.hypervisor.conftest import wait_for
from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import POD

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")


def example() -> list[list[str]]:
    """The commands of the worked example in docs/dra.md."""
    text = (ROOT / "docs" / "dra.md").read_text()
    block = re.search(r"## A worked example\n+```sh\n(.*?)```", text, re.S)
    assert block is not None
    return [shlex.split(line, comments=True) for line in block[1].splitlines() if line.strip()]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_the_worked_example(dra: DraNode, plugin: Plugin, facts: NodeFacts, tmp_path: Path) -> None:
    api = dra.api
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                   "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))}  # fmt: skip
    client = open_client(str(api.kubeconfig(tmp_path / "driver")))
    SlicePublisher(client, NODE, facts).publish(gpu.uuid for gpu in facts.gpus)
    outputs = []
    scheduled = False
    for command in example():
        assert command[0] == "kubectl", command
        if command[1] == "delete":  # kubectl waits for the pod to go: the node's turn
            outputs.append(run(command, environment, meanwhile=lambda: stopped(api, plugin)))
            continue
        if command[1] == "get" and not scheduled:  # the cluster's turn: scheduler, kubelet
            assert Scheduler(api).schedule("default", "cuda-4gi-30") == NODE
            pod = api.store.get(POD, "default", "cuda-4gi-30")
            (status,) = pod["status"]["resourceClaimStatuses"]
            claim = status["resourceClaimName"]
            uid = json.loads(run(["kubectl", "get", "resourceclaim", claim, "-o", "json"],
                                 environment))["metadata"]["uid"]  # fmt: skip
            answer = plugin.prepare(("default", claim, uid)).claims[uid]
            assert answer.error == "", answer.error
            record = dra.node.store.get("default", "cuda-4gi-30")
            limits = [d.limits.value for d in record.devices]
            scheduled = True
        outputs.append(run(command, environment))
    assert scheduled
    applied, examples, slices, names, claims, deleted, left = outputs
    assert "deviceclass.resource.k8s.io/gpu.vgpu.io created" in applied
    assert "pod/cuda-4gi-30 created" in examples
    assert f"{NODE}-gpu.vgpu.io" in slices
    assert re.search(r"^cuda-4gi-30-gpu-[a-z0-9]{5}\b", names, re.M), names
    (item,) = json.loads(claims)["items"]
    (result,) = item["status"]["allocation"]["devices"]["results"]
    assert (result["device"], result["consumedCapacity"]) == (
        "gpu-0", {"memory": str(4 * GiB), "compute": "30"}
    )  # fmt: skip
    assert [c["name"] for c in item["status"]["reservedFor"]] == ["cuda-4gi-30"]
    assert limits == [GpuLimits(memory=4 * GiB, compute=3000, burst=6000)]
    assert deleted == 'pod "cuda-4gi-30" deleted\n'
    assert left == ""  # kubectl says "No resources found" on stderr
    assert dra.node.store.scan() == []  # unprepared: the region and the CDI spec are gone
    assert list(dra.cdi_dir.iterdir()) == []


def stopped(api: ApiServer, plugin: Plugin) -> None:
    """The node stops the deleted pod (its claim unprepared first), then the claim controller
    and the garbage collector release, deallocate and delete its claim."""
    pod = wait_for(lambda: deleting(api, "default", "cuda-4gi-30"), timeout=30)
    (status,) = pod["status"]["resourceClaimStatuses"]
    stop_pod(api, plugin, "default", "cuda-4gi-30")
    assert Scheduler(api).release_claims() == [status["resourceClaimName"]]


def deleting(api: ApiServer, namespace: str, name: str) -> dict[str, Any] | None:
    pod = api.store.get(POD, namespace, name)
    return pod if pod["metadata"].get("deletionTimestamp") else None


def run(
    command: list[str], environment: dict[str, str], meanwhile: Callable[[], None] | None = None
) -> str:
    """kubectl's output; ``meanwhile`` runs while it does."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        if meanwhile is not None:
            meanwhile()
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, f"{shlex.join(command)}: {err}"
    return out
