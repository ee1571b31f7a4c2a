"""Opaque parameters (GpuConfig) of a claim or its class, through Prepare: the burst,
oversubscription, class and weight they give the pod's region, and one-line errors."""

from typing import Any

import pytest
from vgpu_common.limits import GpuLimits, Qos
from vgpu_hypervisor.gpu import NodeSnapshot

from tests.dra.conftest import NAMESPACE, DraNode, GiB
from tests.dra.kubelet import Plugin
from tests.dra.test_driver import prepared, region_limits

CONSUMED = {"memory": "2Gi", "compute": "30"}


def config(source: str, requests: list[str] | None = None, **parameters: Any) -> dict[str, Any]:
    opaque = {"driver": "gpu.vgpu.io", "parameters": {
        "apiVersion": "gpu.vgpu.io/v1alpha1", "kind": "GpuConfig", **parameters}}  # fmt: skip
    return {"source": source, **({"requests": requests} if requests else {}), "opaque": opaque}


def test_parameters_of_the_class_and_the_claim_set_burst_oversubscription_class_and_weight(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    uuid = str(snapshot.devices[0].uuid)
    pod = dra.add_pod("tuned")
    configs = [
        config("FromClass", burst=50, qos="low", oversubscribe=True),
        config("FromClaim", ["gpu"], burst="80%", qos="high", weight=7),  # later: it wins
    ]
    claim = dra.add_claim(
        "tuned", pod, [{"device": "gpu-0", "consumedCapacity": CONSUMED}], config=configs
    )
    assert prepared(plugin, claim).error == ""
    assert region_limits(dra, "tuned") == {
        uuid: GpuLimits(memory=2 * GiB, compute=3000, burst=8000, oversubscribe=True)
    }
    record = dra.node.store.get(NAMESPACE, "tuned")
    assert (record.qos, record.weight) == (Qos.HIGH, 7)


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        ({"burst": 20}, "burst 20 % is below the 30 % of compute it consumed"),
        ({"burst": "lots"}, "burst 'lots': expected a percent from 0.01 to 100"),
        ({"qos": "urgent"}, "qos 'urgent': expected low, medium, high or critical"),
        ({"weight": -1}, "weight -1: expected a whole number from 0 to 1000000"),
        ({"oversubscribe": "maybe"}, "oversubscribe 'maybe'"),
        ({"limit": 3}, "unknown key(s) limit"),
        ({"kind": "Other"}, "expected apiVersion gpu.vgpu.io/v1alpha1 and kind GpuConfig"),
    ],
    ids=["burst-low", "burst-word", "qos", "weight", "switch", "unknown", "kind"],
)
def test_bad_parameters_fail_prepare_with_one_line_naming_the_claim_and_key(
    dra: DraNode, plugin: Plugin, parameters: dict[str, Any], error: str
) -> None:
    pod = dra.add_pod("wrong")
    claim = dra.add_claim(
        "wrong",
        pod,
        [{"device": "gpu-0", "consumedCapacity": CONSUMED}],
        config=[config("FromClaim", **parameters)],
    )
    answer = prepared(plugin, claim)
    assert answer.error.startswith("prepare claim team/wrong: claim team/wrong: "), answer.error
    assert error in answer.error and "\n" not in answer.error, answer.error
    assert dra.node.store.scan() == []
