"""What a tenant writes into its own ResourceClaims (the opaque parameters, within what the
API server lets through) against the driver: it costs other pods nothing."""

from typing import Any

from vgpu_hypervisor.dra.checkpoint import FILE
from vgpu_hypervisor.dra.config import canonical, parse_config
from vgpu_hypervisor.gpu import NodeSnapshot

from tests.dra.conftest import DraNode
from tests.dra.kubelet import DraKubelet, Plugin
from tests.dra.test_config import config
from tests.dra.test_driver import prepared, unprepared

# The API server's bounds on a claim's opaque parameters (k8s.io/kubernetes pkg/apis/resource:
# OpaqueParametersMaxLength, DeviceConfigMaxSize): 10 KiB each, 32 configurations a claim.
PARAMETERS_MOST = 10 * 1024
CONFIGS_MOST = 32
CONSUMED = {"memory": "1Gi", "compute": "5"}


def padded_configs() -> list[dict[str, Any]]:
    """32 configurations, each of 10 KiB on the wire: a qos of "high" after NEL characters
    (U+0085, blanks to str.strip; 2 bytes of UTF-8, 6 once written as JSON with \\u escapes)."""
    head = '{"apiVersion":"gpu.vgpu.io/v1alpha1","kind":"GpuConfig","qos":"high"}'
    padding = "\x85" * ((PARAMETERS_MOST - len(head)) // 2)
    return [config("FromClaim", qos=padding + "high") for _ in range(CONFIGS_MOST)]


def test_claims_padded_to_the_api_servers_bounds_leave_the_checkpoint_readable(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    victim_pod = dra.add_pod("victim")
    victim = dra.add_claim(
        "victim", victim_pod, [{"device": "gpu-1", "consumedCapacity": CONSUMED}]
    )
    assert prepared(plugin, victim).error == ""
    # Another tenant: three pods of six claims each, every claim at the API server's bounds.
    for p in range(3):
        pod = dra.add_pod(f"padded-{p}")
        for c in range(6):
            claim = dra.add_claim(
                f"padded-{p}-{c}",
                pod,
                [{"device": "gpu-0", "consumedCapacity": CONSUMED}],
                config=padded_configs(),
            )
            assert prepared(plugin, claim).error == ""
    checkpoint = dra.node.store.base / ".daemon" / FILE
    # Before, the parameters were kept as written: 18 MiB, past what the daemon reads back
    # (16 MiB), so a restarted daemon forgot every claim of the node.
    assert checkpoint.stat().st_size < 1 << 20

    dra.stop()
    driver = dra.start()
    assert victim["metadata"]["uid"] in driver.preparer.prepared()
    kubelet = DraKubelet(dra.sockets.registry)
    try:
        again = kubelet.register()
        assert unprepared(again, victim) == ""
    finally:
        kubelet.close()
    # Its Unprepare deleted its region (forgotten, the claim was "unprepared already").
    assert "victim" not in {record.name for record in dra.node.store.scan()}


def test_parameters_kept_as_the_driver_writes_them_read_back_the_same() -> None:
    written = {"apiVersion": "gpu.vgpu.io/v1alpha1", "kind": "GpuConfig"}
    for parameters in (
        {"burst": 12.5, "qos": " High\x85", "weight": 7, "oversubscribe": "yes"},
        {"burst": "100 %", "qos": "critical", "oversubscribe": False},
        {"burst": "0.01"},
        {},
    ):
        found = parse_config(written | parameters, "claim t/c")
        kept = canonical(written | parameters, "claim t/c")
        assert parse_config(kept, "claim t/c") == found
