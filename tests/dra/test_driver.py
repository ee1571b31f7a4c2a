"""The DRA driver against a stand-in kubelet over real gRPC, its claims and pods read from an
API server, on the simulated GPU."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu_common.limits import GpuLimits
from vgpu_hypervisor.dra.quota import RELEASED
from vgpu_hypervisor.gpu import NodeSnapshot
from vgpu_limiter import sim
from vgpu_limiter.region import FLAG_DELETED, open_region

from tests.device_plugin.test_device_plugin import run_workload
from tests.dra.conftest import CLAIMS, NAMESPACE, DraNode, GiB
from tests.dra.kubelet import DraKubelet, Plugin
from tests.hypervisor.conftest import clean_environment, wait_for
from tests.limiter.test_region import claim as fill_slot
from tests.limiter.test_region import raw
from tests.support.apiserver.kinds import POD


def region_limits(dra: DraNode, pod: str) -> dict[str, GpuLimits]:
    record = dra.node.store.get(NAMESPACE, pod)
    assert record.error is None, record.error
    return {device.uuid: device.limits.value for device in record.devices}


def prepared(plugin: Plugin, claim: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    answer = plugin.prepare((NAMESPACE, meta["name"], meta["uid"])).claims[meta["uid"]]
    return answer


def unprepared(plugin: Plugin, claim: dict[str, Any]) -> str:
    meta = claim["metadata"]
    answer = plugin.unprepare((NAMESPACE, meta["name"], meta["uid"])).claims[meta["uid"]]
    error: str = answer.error
    return error


def spec_of(dra: DraNode, claim: dict[str, Any]) -> dict[str, Any]:
    path = dra.cdi_dir / f"gpu.vgpu.io-claim_{claim['metadata']['uid']}.json"
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def test_registration_names_the_driver_its_socket_and_both_services(
    dra: DraNode, plugin: Plugin
) -> None:
    assert plugin.info.name == "gpu.vgpu.io"
    assert plugin.info.endpoint == str(dra.sockets.plugins / "gpu.vgpu.io" / "dra.sock")
    assert list(plugin.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert plugin.version == "v1.DRAPlugin"
    assert dra.driver is not None and dra.driver.registered.wait(5)


def test_a_kubelet_restart_that_empties_its_registry_registers_the_driver_again(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    driver = dra.driver
    assert driver is not None and driver.registered.wait(5)
    pod = dra.add_pod("trainer")
    consumed = {"memory": "2Gi", "compute": "20"}
    claim = dra.add_claim("trainer-gpu", pod, [{"device": "gpu-0", "consumedCapacity": consumed}])
    assert prepared(plugin, claim).error == ""

    kubelet = DraKubelet(dra.sockets.registry)
    kubelet.restart()  # the registration socket is gone
    again = kubelet.register()  # made again by the driver: GetInfo, NotifyRegistrationStatus
    try:
        assert again.info == plugin.info
        assert driver.registered.wait(5)
        assert prepared(again, claim).error == ""  # answered again after the restart
        assert unprepared(again, claim) == ""
    finally:
        kubelet.close()


def test_a_service_socket_removed_is_served_again(dra: DraNode, plugin: Plugin) -> None:
    kubelet = DraKubelet(dra.sockets.registry)
    try:
        kubelet.restart()
        dra.sockets.service_socket.unlink()  # the kubelet's plugins folder emptied too
        again = kubelet.register()
        wait_for(dra.sockets.service_socket.is_socket, timeout=30)
        assert again.prepare().claims == {}  # the service answers on the new socket
    finally:
        kubelet.close()


def test_prepare_gives_the_pod_a_region_with_the_consumed_capacity_and_a_cdi_spec(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    uuid = str(snapshot.devices[0].uuid)
    pod = dra.add_pod("trainer")
    consumed = {"memory": "4Gi", "compute": "30"}
    claim = dra.add_claim(
        "trainer-gpu", pod, [{"device": "gpu-0", "consumedCapacity": consumed, "shareID": "s1"}]
    )
    answer = prepared(plugin, claim)
    assert answer.error == ""
    (device,) = answer.devices
    uid = claim["metadata"]["uid"]
    assert (device.pool_name, device.device_name, device.share_id) == ("node-1", "gpu-0", "s1")
    assert list(device.request_names) == ["gpu"]
    assert list(device.cdi_device_ids) == [
        f"gpu.vgpu.io/claim={uid}",
        f"gpu.vgpu.io/claim={uid}-gpu-0",
    ]
    assert region_limits(dra, "trainer") == {uuid: GpuLimits(memory=4 * GiB, compute=3000)}

    spec = spec_of(dra, claim)
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", "gpu.vgpu.io/claim")
    common, own = spec["devices"]
    env = dict(line.split("=", 1) for line in common["containerEdits"]["env"])
    assert env["SHM_PATH"] == f"/run/tensor-fusion/shm/{NAMESPACE}/trainer"
    assert env["TF_REGION_REQUIRED"] == "1"
    assert own["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/nvidia0",
            "hostPath": str(dra.node.layout.dev_root / "nvidia0"),
            "permissions": "rw",
        }
    ]
    nodes = {node["path"] for node in common["containerEdits"]["deviceNodes"]}
    assert nodes == {"/dev/nvidiactl", "/dev/nvidia-uvm"}  # those the node has
    # No NVIDIA CDI spec on the node: the NVIDIA runtime gives the driver's libraries for the
    # GPUs named as Allocate names them (the variable, and the volume-mounts device list).
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert own["containerEdits"]["mounts"] == [
        {
            "hostPath": "/dev/null",
            "containerPath": f"/var/run/nvidia-container-devices/{uuid}",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    ]

    again = prepared(plugin, claim)  # the kubelet asks again: the same answer
    assert again == answer
    assert region_limits(dra, "trainer") == {uuid: GpuLimits(memory=4 * GiB, compute=3000)}


def nvidia_spec(folder: Path, *names: str) -> None:
    """NVIDIA's CDI spec as nvidia-ctk writes it (YAML), with devices of these names."""
    folder.mkdir(exist_ok=True)
    library = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
            for name in names
        ],
        "containerEdits": {
            "mounts": [{"hostPath": library, "containerPath": library,
                        "options": ["ro", "nosuid", "nodev", "bind"]}],
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                       "args": ["nvidia-cdi-hook", "update-ldcache"]}],
        },
    }  # fmt: skip
    (folder / "nvidia.yaml").write_text(yaml.safe_dump(spec))


@pytest.mark.parametrize("by", ["uuid", "index"])
def test_nvidia_cdi_spec_on_the_node_gives_the_driver_libraries(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot, by: str
) -> None:
    uuid = str(snapshot.devices[0].uuid)
    folder = dra.config.nvidia_cdi_dirs[0]
    nvidia_spec(folder, uuid if by == "uuid" else "0", "all")
    (folder / "broken.yaml").write_text("kind: [")  # passed over
    pod = dra.add_pod("trainer")
    consumed = {"memory": "4Gi", "compute": "30"}
    claim = dra.add_claim("trainer-gpu", pod, [{"device": "gpu-0", "consumedCapacity": consumed}])
    answer = prepared(plugin, claim)
    assert answer.error == ""
    (device,) = answer.devices
    uid = claim["metadata"]["uid"]
    assert list(device.cdi_device_ids) == [
        f"gpu.vgpu.io/claim={uid}",
        f"gpu.vgpu.io/claim={uid}-gpu-0",
        f"nvidia.com/gpu={uuid if by == 'uuid' else '0'}",  # its libraries, nodes and hooks
    ]
    common, own = spec_of(dra, claim)["devices"]
    env = dict(line.split("=", 1) for line in common["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # an NVIDIA runtime adds nothing more
    assert "mounts" not in own["containerEdits"]


def test_a_claim_with_a_gpu_nvidias_spec_lacks_is_left_to_the_nvidia_runtime(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    first, second = (str(d.uuid) for d in snapshot.devices[:2])
    nvidia_spec(dra.config.nvidia_cdi_dirs[0], first)
    pod = dra.add_pod("pair")
    whole = {"memory": "1Gi", "compute": "10"}
    claim = dra.add_claim(
        "pair-gpus",
        pod,
        [{"device": f"gpu-{i}", "consumedCapacity": whole} for i in (0, 1)],
    )
    answer = prepared(plugin, claim)
    assert answer.error == ""
    ids = [i for d in answer.devices for i in d.cdi_device_ids]
    assert not [i for i in ids if i.startswith("nvidia.com/")]
    common, *own = spec_of(dra, claim)["devices"]
    env = dict(line.split("=", 1) for line in common["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(sorted([first, second]))
    listed = [m["containerPath"] for d in own for m in d["containerEdits"]["mounts"]]
    assert listed == [f"/var/run/nvidia-container-devices/{u}" for u in (first, second)]


def cdi_environment(spec: dict[str, Any], sim_state: Path) -> dict[str, str]:
    """Exactly the spec's env on the simulated GPU, container paths as its mounts map them."""
    edits = [device["containerEdits"] for device in spec["devices"]]
    mounts = sorted(
        ((m["containerPath"], m["hostPath"]) for e in edits for m in e.get("mounts", [])),
        key=len,
        reverse=True,
    )

    def on_host(value: str) -> str:
        for inside, host in mounts:
            value = value.replace(inside, host)
        return value

    env = dict(line.split("=", 1) for e in edits for line in e.get("env", []))
    environment = clean_environment() | sim.environment(state=str(sim_state))
    return environment | {name: on_host(value) for name, value in env.items()}


def test_a_workload_with_exactly_the_cdi_spec_is_limited_to_its_consumed_capacity(
    dra: DraNode, plugin: Plugin, sim_state: Path
) -> None:
    pod = dra.add_pod("tenant")
    consumed = {"memory": "2Gi", "compute": "40"}
    claim = dra.add_claim("tenant-gpu", pod, [{"device": "gpu-0", "consumedCapacity": consumed}])
    assert prepared(plugin, claim).error == ""
    environment = cdi_environment(spec_of(dra, claim), sim_state)
    assert environment["LD_PRELOAD"].startswith(str(dra.node.layout.host_lib_dir))

    fits = run_workload(environment, "1GiB")
    assert fits.get("error") is None, fits
    assert fits["total_bytes"] == 2 * GiB  # the consumed memory, seen as the GPU's
    refused = run_workload(environment, "3GiB")
    assert refused["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", refused


def test_two_claims_of_one_pod_add_up_in_its_one_region_and_unprepare_undoes_each(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    first, second = (str(device.uuid) for device in snapshot.devices[:2])
    pod = dra.add_pod("both")
    a = dra.add_claim(
        "a", pod, [{"device": "gpu-0", "consumedCapacity": {"memory": "1Gi", "compute": "10"}}]
    )
    b = dra.add_claim(
        "b",
        pod,
        [
            {"device": "gpu-0", "consumedCapacity": {"memory": "2Gi", "compute": "20"}},
            {"device": "gpu-1", "consumedCapacity": {"memory": "3Gi", "compute": "100"}},
        ],
    )
    assert prepared(plugin, a).error == "" and prepared(plugin, b).error == ""
    assert region_limits(dra, "both") == {
        first: GpuLimits(memory=3 * GiB, compute=3000),
        second: GpuLimits(memory=3 * GiB, compute=None),  # all of its time: no compute limit
    }
    assert unprepared(plugin, b) == ""
    assert region_limits(dra, "both")[first] == GpuLimits(memory=GiB, compute=1000)
    assert not (dra.cdi_dir / f"gpu.vgpu.io-claim_{b['metadata']['uid']}.json").exists()
    assert unprepared(plugin, a) == ""
    assert [r.name for r in dra.node.store.scan()] == []  # the pod's region is gone
    assert list(dra.cdi_dir.iterdir()) == []
    assert unprepared(plugin, a) == ""  # unprepared already: nothing to do


def test_a_restarted_driver_answers_and_unprepares_from_its_checkpoint(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    pod = dra.add_pod("kept")
    claim = dra.add_claim(
        "kept", pod, [{"device": "gpu-0", "consumedCapacity": {"memory": "1Gi", "compute": "50"}}]
    )
    before = prepared(plugin, claim)
    assert before.error == ""
    dra.stop()
    # The claim and pod are gone from the API server meanwhile.
    dra.api.store.delete(CLAIMS, NAMESPACE, "kept")
    dra.api.store.delete(POD, NAMESPACE, "kept", grace=0)
    dra.start()
    kubelet = DraKubelet(dra.sockets.registry)
    try:
        again = kubelet.register()
        assert prepared(again, claim) == before
        assert unprepared(again, claim) == ""
    finally:
        kubelet.close()
    assert dra.node.store.scan() == []


def test_an_older_kubelet_speaks_v1beta1(dra: DraNode, snapshot: NodeSnapshot) -> None:
    kubelet = DraKubelet(dra.sockets.registry, versions=("v1beta1.DRAPlugin",))
    try:
        plugin = kubelet.register()
        pod = dra.add_pod("old")
        claim = dra.add_claim("old", pod, [{"device": "gpu-1"}])  # no consumable capacity
        answer = prepared(plugin, claim)
        assert answer.error == "" and answer.devices[0].device_name == "gpu-1"
    finally:
        kubelet.close()
    uuid = str(snapshot.devices[1].uuid)
    memory = snapshot.devices[1].memory_total
    assert isinstance(memory, int)
    assert region_limits(dra, "old") == {uuid: GpuLimits(memory=memory, compute=None)}


def consumed(**capacity: str) -> Callable[[dict[str, Any]], None]:
    """A change of a claim's status: its first device consumed ``capacity``."""
    return lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
        consumedCapacity=capacity
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda c: c["status"].pop("allocation"), "not allocated any gpu.vgpu.io device"),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="node-2"),
            "device node-2/gpu-0 is not one of this node's (node-1)",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="gpu-7"),
            "device node-1/gpu-7 is not one of this node's (node-1)",
        ),
        (
            lambda c: c["status"]["reservedFor"].clear(),
            "reserved for 0 pods; a gpu.vgpu.io claim gives one pod its quota",
        ),
        (
            lambda c: c["status"]["reservedFor"][0].update(uid="other"),
            "reserved for pod bad UID other, but that pod is UID",
        ),
        (consumed(memory="1.5", compute="30"),
         "device gpu-0: memory '1.5': expected a whole number"),
        # Below the slice's least (the scheduler rounds up to it): a compute of 0 was taken
        # as the whole GPU, a memory of 0 failed as "ValueError: bad memory limit 0".
        (consumed(memory="1Gi", compute="0"),
         "device gpu-0: compute '0' is below the least a share consumes, 1"),
        (consumed(memory="0", compute="10"),
         "device gpu-0: memory '0' is below the least a share consumes, 1048576"),
        (consumed(memory="1Ti", compute="10"),
         "device gpu-0: memory 1099511627776 is more than the GPU has, "),
    ],
    ids=[
        "unallocated", "other-pool", "unknown-device", "no-pod", "pod-uid", "bad-memory",
        "no-compute", "no-memory", "more-memory-than-the-gpu",
    ],
)  # fmt: skip
def test_a_claim_that_cannot_be_prepared_gets_a_one_line_error(
    dra: DraNode, plugin: Plugin, change: Any, error: str
) -> None:
    pod = dra.add_pod("bad")
    claim = dra.add_claim("bad", pod, [{"device": "gpu-0"}])
    change(claim)
    claim = dra.api.store.put(CLAIMS, NAMESPACE, claim)
    answer = prepared(plugin, claim)
    assert error in answer.error and "\n" not in answer.error, answer.error
    assert answer.error.startswith("prepare claim team/bad: ")
    assert not list(answer.devices)
    assert dra.node.store.scan() == []  # nothing made


def test_a_claim_made_anew_under_its_name_is_not_prepared_for_the_old_uid(
    dra: DraNode, plugin: Plugin
) -> None:
    pod = dra.add_pod("renamed")
    claim = dra.add_claim("renamed", pod, [{"device": "gpu-0"}])
    answer = plugin.prepare((NAMESPACE, "renamed", "old-uid")).claims["old-uid"]
    assert f"its UID is {claim['metadata']['uid']}, not old-uid" in answer.error


@pytest.mark.parametrize(
    ("security", "owner"),
    [({"runAsUser": 1000, "runAsGroup": 3000}, (1000, 3000)), ({"fsGroup": 4242}, (0, 4242))],
    ids=["run-as-user", "fs-group"],
)
def test_the_region_belongs_to_the_pods_user_or_group_as_with_the_device_plugin(
    dra: DraNode, plugin: Plugin, security: dict[str, int], owner: tuple[int, int]
) -> None:
    pod = dra.add_pod("nonroot", **security)
    claim = dra.add_claim("nonroot", pod, [{"device": "gpu-0"}])
    assert prepared(plugin, claim).error == ""
    region = dra.node.layout.host_base / NAMESPACE / "nonroot" / "shm"
    info, folder = region.stat(), region.parent.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (*owner, 0o660)
    assert (folder.st_uid, folder.st_mode & 0o777) == (0, 0o755)  # the daemon's own


NIC = "nic.example.com"  # another DRA driver


@pytest.mark.parametrize(
    "others",
    [
        # A mesh proxy as another user beside the GPU container.
        {"containers": [{"name": "istio-proxy", "image": "envoy",
                         "securityContext": {"runAsUser": 1337}}]},
        # An init container as its image's user (root, often), and a sidecar of another claim.
        {"initContainers": [{"name": "setup", "image": "busybox"},
                            {"name": "nic", "image": "nic", "restartPolicy": "Always",
                             "securityContext": {"runAsUser": 2000},
                             "resources": {"claims": [{"name": "nic"}]}}],
         "resourceClaims": [{"name": "nic", "resourceClaimName": "the-nic"}]},
    ],
    ids=["proxy", "init-and-other-claim"],
)  # fmt: skip
def test_the_region_belongs_to_the_user_of_the_containers_given_the_claim(
    dra: DraNode, plugin: Plugin, others: dict[str, Any]
) -> None:
    # Before, every container of the pod counted: users that differ made the region root's,
    # and the GPU container (user 1000) could not open it (TF_REGION_REQUIRED: cuInit failed).
    pod = dra.add_pod("meshed")
    spec = pod["spec"]
    spec["resourceClaims"] = [{"name": "gpu"}, *others.pop("resourceClaims", [])]
    spec["containers"] = [
        {"name": "main", "image": "cuda", "securityContext": {"runAsUser": 1000},
         "resources": {"claims": [{"name": "gpu"}]}},
        *others.pop("containers", []),
    ]  # fmt: skip
    spec |= others
    # The claim made from a template: the pod's status names it.
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "meshed-gpu"}]}
    pod = dra.api.store.put(POD, NAMESPACE, pod)
    for other in spec["resourceClaims"][1:]:  # another driver's (a NIC's): read, left out
        dra.add_claim(other["resourceClaimName"], pod, [{"device": "nic-0", "driver": NIC}])
    claim = dra.add_claim("meshed-gpu", pod, [{"device": "gpu-0"}])
    assert prepared(plugin, claim).error == ""
    region = dra.node.layout.host_base / NAMESPACE / "meshed" / "shm"
    assert region.stat().st_uid == 1000


def ref(claim: dict[str, Any]) -> tuple[str, str, str]:
    """A claim as the kubelet names it: namespace, name, UID."""
    meta = claim["metadata"]
    return NAMESPACE, meta["name"], meta["uid"]


def pod_of_two_claims(dra: DraNode, name: str, **security: int) -> dict[str, Any]:
    """A pod whose container a runs as user 1000 and is given claim x ({name}-x), b as 2000
    given y ({name}-y), both claims this driver's."""
    pod = dra.add_pod(name, **security)
    pod["spec"]["resourceClaims"] = [
        {"name": "x", "resourceClaimName": f"{name}-x"},
        {"name": "y", "resourceClaimName": f"{name}-y"},
    ]
    pod["spec"]["containers"] = [
        {"name": "a", "image": "cuda", "securityContext": {"runAsUser": 1000},
         "resources": {"claims": [{"name": "x"}]}},
        {"name": "b", "image": "cuda", "securityContext": {"runAsUser": 2000},
         "resources": {"claims": [{"name": "y"}]}},
    ]  # fmt: skip
    return dra.api.store.put(POD, NAMESPACE, pod)


@pytest.mark.parametrize("order", ["x-then-y", "y-then-x", "apart"])
@pytest.mark.parametrize(
    ("security", "group"),
    [({"fsGroup": 4242}, 4242), ({"runAsGroup": 3000}, 3000), ({}, 0)],
    ids=["fs-group", "run-as-group", "no-group"],
)
def test_the_region_of_claims_given_to_containers_of_two_users_is_theirs_all(
    dra: DraNode, plugin: Plugin, security: dict[str, int], group: int, order: str
) -> None:
    # Both containers open the pod's one region, so it is no one user's but root's, with the
    # group both run with (else root's: the rule for two users of one claim, kubernetes.md).
    # Before, only the prepared claim's containers counted: the region was the user's of the
    # claim prepared first (1000 with fsGroup 4242), and the other's limiter (2000) refused
    # it, "owned by another user", though its group could open it: CUDA did not start.
    pod = pod_of_two_claims(dra, "pair", **security)
    share = {"consumedCapacity": {"memory": "1Gi", "compute": "10"}}
    x = dra.add_claim("pair-x", pod, [{"device": "gpu-0", **share}])
    y = dra.add_claim("pair-y", pod, [{"device": "gpu-1", **share}])
    region = dra.node.layout.host_base / NAMESPACE / "pair" / "shm"
    if order == "apart":  # y alone, then x after the kubelet restarted
        assert prepared(plugin, y).error == ""
        assert region.stat().st_uid == 0  # as made: x's container counted already
        kubelet = DraKubelet(dra.sockets.registry)
        kubelet.restart()
        try:
            assert prepared(kubelet.register(), x).error == ""
        finally:
            kubelet.close()
    else:  # as the kubelet sends them: the pod's claims in one request
        claims = (x, y) if order == "x-then-y" else (y, x)
        answers = plugin.prepare(*map(ref, claims)).claims
        assert [answers[c["metadata"]["uid"]].error for c in claims] == ["", ""]
    info = region.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, group, 0o660)


def test_one_user_of_two_claims_owns_their_region_whichever_comes_first(
    dra: DraNode, plugin: Plugin
) -> None:
    # The containers of both claims run as 1000 (the pod's), a proxy beside them as 1337.
    pod = pod_of_two_claims(dra, "solo", runAsUser=1000)
    del pod["spec"]["containers"][1]["securityContext"]
    pod["spec"]["containers"].append(
        {"name": "proxy", "image": "envoy", "securityContext": {"runAsUser": 1337}}
    )
    pod = dra.api.store.put(POD, NAMESPACE, pod)
    x = dra.add_claim("solo-x", pod, [{"device": "gpu-0"}])
    y = dra.add_claim("solo-y", pod, [{"device": "gpu-1"}])
    assert prepared(plugin, y).error == ""
    assert prepared(plugin, x).error == ""
    region = dra.node.layout.host_base / NAMESPACE / "solo" / "shm"
    assert (region.stat().st_uid, region.stat().st_gid) == (1000, 0)


def test_a_claim_of_the_pod_that_cannot_be_read_fails_prepare_until_it_can(
    dra: DraNode, plugin: Plugin
) -> None:
    # Whether it is this driver's decides the region's owner, which is set once: a guess
    # could leave a container unable to open the region for the pod's life.
    pod = pod_of_two_claims(dra, "early", fsGroup=4242)
    x = dra.add_claim("early-x", pod, [{"device": "gpu-0"}])
    answer = prepared(plugin, x)
    assert "pod early: its region's owner: cannot read claim team/early-y: 404" in answer.error
    assert "\n" not in answer.error
    assert dra.node.store.scan() == []  # nothing made, nothing recorded
    dra.add_claim("early-y", pod, [{"device": "gpu-1"}])
    assert prepared(plugin, x).error == ""  # the kubelet asks again
    region = dra.node.layout.host_base / NAMESPACE / "early" / "shm"
    assert (region.stat().st_uid, region.stat().st_gid) == (0, 4242)


def test_a_claim_of_the_pod_not_allocated_yet_fails_prepare_until_it_is(
    dra: DraNode, plugin: Plugin
) -> None:
    # Not allocated, it cannot say whether it is this driver's: taken as another driver's,
    # its containers would have been left out of the owner for the pod's life.
    pod = pod_of_two_claims(dra, "waiting", fsGroup=4242)
    x = dra.add_claim("waiting-x", pod, [{"device": "gpu-0"}])
    y = dra.add_claim("waiting-y", pod, [{"device": "gpu-1"}])
    dra.api.store.put(CLAIMS, NAMESPACE, {**y, "status": {}})
    answer = prepared(plugin, x)
    assert "pod waiting: its region's owner: claim team/waiting-y: not allocated yet" in (
        answer.error
    )
    assert dra.node.store.scan() == []
    dra.add_claim("waiting-y", pod, [{"device": "gpu-1"}])
    assert prepared(plugin, x).error == ""
    region = dra.node.layout.host_base / NAMESPACE / "waiting" / "shm"
    assert (region.stat().st_uid, region.stat().st_gid) == (0, 4242)


def test_a_claim_allocated_for_a_subrequest_is_given_to_the_containers_of_its_request(
    dra: DraNode, plugin: Plugin
) -> None:
    # firstAvailable: the scheduler writes "gpu/small"; a container names "gpu", and the
    # kubelet gives it only devices whose request names hold "gpu". Before, the answer said
    # "gpu/small" and the container got none of the driver's (no limiter, no region).
    pod = dra.add_pod("prioritized")
    claim = dra.add_claim(
        "prioritized",
        pod,
        [{"device": "gpu-0", "request": "gpu/small", "consumedCapacity": {"compute": "20"}}],
    )
    answer = prepared(plugin, claim)
    assert answer.error == ""
    assert [list(device.request_names) for device in answer.devices] == [["gpu"]]


def test_two_claims_on_one_gpu_one_with_a_burst_are_both_prepared(
    dra: DraNode, plugin: Plugin
) -> None:
    # Claim a: 30 % with a burst of 40 %; claim b: 50 %, no burst. The GPU's compute is 80 %
    # and its burst a's 40 plus b's own 50 (no less than the compute, so the region holds it);
    # b, once refused, was kept in the checkpoint and refused again on every try.
    pod = dra.add_pod("s")
    parameters = {"apiVersion": "gpu.vgpu.io/v1alpha1", "kind": "GpuConfig", "burst": 40}
    config = [{"source": "FromClaim", "requests": [],
               "opaque": {"driver": "gpu.vgpu.io", "parameters": parameters}}]  # fmt: skip
    share = {"device": "gpu-0", "consumedCapacity": {"memory": "1Gi", "compute": "30"}}
    a = dra.add_claim("a", pod, [share], config=config)
    share = {"device": "gpu-0", "consumedCapacity": {"memory": "1Gi", "compute": "50"}}
    b = dra.add_claim("b", pod, [share])
    assert prepared(plugin, a).error == ""
    assert prepared(plugin, b).error == ""
    assert prepared(plugin, b).error == ""  # asked again: answered from the checkpoint
    (limits,) = region_limits(dra, "s").values()
    assert limits == GpuLimits(memory=2 * GiB, compute=8000, burst=9000)


def test_a_claim_that_leaves_takes_its_class_with_it(dra: DraNode, plugin: Plugin) -> None:
    """Before, the pod kept the class of a claim unprepared while another of its claims stayed:
    the class was written only when the claims left gave one."""
    pod = dra.add_pod("q")
    parameters = {"apiVersion": "gpu.vgpu.io/v1alpha1", "kind": "GpuConfig", "qos": "critical"}
    config = [{"source": "FromClaim", "requests": [],
               "opaque": {"driver": "gpu.vgpu.io", "parameters": parameters}}]  # fmt: skip
    share = {"device": "gpu-0", "consumedCapacity": {"memory": "1Gi", "compute": "30"}}
    a = dra.add_claim("a", pod, [share], config=config)
    share = {"device": "gpu-1", "consumedCapacity": {"memory": "1Gi", "compute": "50"}}
    b = dra.add_claim("b", pod, [share])
    assert prepared(plugin, a).error == "" and prepared(plugin, b).error == ""
    assert dra.node.store.get(NAMESPACE, "q").qos == 3  # critical
    assert unprepared(plugin, a) == ""
    assert dra.node.store.get(NAMESPACE, "q").qos == 1  # medium, the default


def test_a_claim_unprepared_while_another_stays_leaves_its_gpu_granting_nothing(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    """A pod with a claim on GPU 0 and one on GPU 1, the second unprepared while the first
    stays. Before, GPU 1's entry kept the departed claim's 3 GiB and 50 % until the pod's last
    claim went: the pod kept a GPU it no longer held, and the daemon weighed it there."""
    first, second = (str(device.uuid) for device in snapshot.devices[:2])
    pod = dra.add_pod("split")
    a = dra.add_claim(
        "a", pod, [{"device": "gpu-0", "consumedCapacity": {"memory": "1Gi", "compute": "10"}}]
    )
    b = dra.add_claim(
        "b", pod, [{"device": "gpu-1", "consumedCapacity": {"memory": "3Gi", "compute": "50"}}]
    )
    assert prepared(plugin, a).error == "" and prepared(plugin, b).error == ""
    assert unprepared(plugin, b) == ""
    limits = region_limits(dra, "split")
    assert limits[first] == GpuLimits(memory=GiB, compute=1000)
    assert limits[second] == RELEASED  # an entry stays (none leaves a region): it holds nothing
    assert unprepared(plugin, b) == ""  # the kubelet's retry: nothing more to do
    assert region_limits(dra, "split") == limits
    dra.stop()
    dra.start()  # a restart answers from the checkpoint: the GPU stays released
    kubelet = DraKubelet(dra.sockets.registry)
    try:
        assert prepared(kubelet.register(), a).error == ""
    finally:
        kubelet.close()
    assert region_limits(dra, "split") == limits


@pytest.mark.parametrize(
    "gpus", [[0], [0, 1], [0, 0]], ids=["one-claim", "two-claims", "two-claims-one-gpu"]
)
@pytest.mark.parametrize("worker", [False, True], ids=["no-worker", "forced-with-a-worker"])
def test_a_region_deleted_through_the_api_before_unprepare_is_not_made_again(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot, gpus: list[int], worker: bool
) -> None:
    """A pod with one or two claims prepared, its region deleted through the daemon's API
    (``DELETE /pods/team/gone``, with force while a worker of the pod still runs: the file
    stays, marked deleted), then the kubelet unprepares its claims one by one. Before, the
    first of two claims' Unprepare made the region again with the other claim's quota (revived
    the file marked deleted, limits written into it, and the last claim's Unprepare then
    failed for as long as the worker ran; on two GPUs, the first Unprepare failed instead,
    the file listing a GPU the other claim does not hold). Now each Unprepare succeeds and
    makes nothing; what the claims left goes (specs, checkpoint), and a new pod of the name
    is prepared."""
    pod = dra.add_pod("gone")
    share = {"consumedCapacity": {"memory": "1Gi", "compute": "10"}}
    made = [
        dra.add_claim(f"gone-{index}", pod, [{"device": f"gpu-{gpu}", **share}])
        for index, gpu in enumerate(gpus)
    ]
    assert [prepared(plugin, one).error for one in made] == [""] * len(made)
    path = dra.node.store.get(NAMESPACE, "gone").path
    if worker:
        with raw(path) as pointer:
            fill_slot(pointer, 0, 4242, [GiB] * len(set(gpus)))  # a worker, judged alive
    dra.node.store.delete(NAMESPACE, "gone", force=worker)  # what the API's delete does

    def left_behind() -> Any:
        """The deleted file's flags and limits while the worker runs, else whether the
        pod's folder is there."""
        if not worker:
            return path.parent.exists()
        region = open_region(path, writable=False)
        try:
            return region.flags & FLAG_DELETED, [d.limits for d in region.devices]
        finally:
            region.close()

    deleted = left_behind()
    assert deleted is False or deleted[0]
    for one in made:
        assert unprepared(plugin, one) == ""
        assert dra.node.store.scan() == []  # no region made again
        assert left_behind() == deleted  # nor the deleted file revived, nor limits written
    assert unprepared(plugin, made[0]) == ""  # the kubelet's retry: nothing to do
    assert dra.driver is not None and dra.driver.preparer.prepared() == {}
    checkpoint = json.loads((dra.node.store.base / ".daemon" / "dra-claims.json").read_text())
    assert checkpoint["claims"] == {}
    assert list(dra.cdi_dir.iterdir()) == []

    # A new pod of the name (on the GPUs the old file lists, which it takes over while the
    # old worker runs) is prepared as any.
    dra.api.store.delete(POD, NAMESPACE, "gone", grace=0)
    again = dra.add_pod("gone")
    assert again["metadata"]["uid"] != pod["metadata"]["uid"]
    share = {"consumedCapacity": {"memory": "2Gi", "compute": "20"}}
    new = dra.add_claim("gone-new", again, [{"device": f"gpu-{gpu}", **share} for gpu in set(gpus)])
    assert prepared(plugin, new).error == ""
    assert region_limits(dra, "gone") == {
        str(snapshot.devices[gpu].uuid): GpuLimits(memory=2 * GiB, compute=2000)
        for gpu in set(gpus)
    }


def gpu_config(source: str, requests: list[str], **parameters: Any) -> dict[str, Any]:
    """An opaque configuration of the allocation, as the scheduler copies it there."""
    parameters |= {"apiVersion": "gpu.vgpu.io/v1alpha1", "kind": "GpuConfig"}
    opaque = {"driver": "gpu.vgpu.io", "parameters": parameters}
    return {"source": source, "requests": requests, "opaque": opaque}


@pytest.mark.parametrize("claims_for", [[], ["gpu"]], ids=["every-request", "the-request"])
def test_the_claims_parameters_win_over_the_classs(
    dra: DraNode, plugin: Plugin, claims_for: list[str]
) -> None:
    """kube-scheduler copies the class's configuration into the allocation naming the request
    it served (``requests: [gpu]``), then the claim's. Before, a class configuration that named
    the request was applied again after a claim's for every request, and won: the claim's
    burst of 80 % gave way to the class's 60."""
    pod = dra.add_pod("tuned")
    config = [
        gpu_config("FromClass", ["gpu"], burst=60, qos="low"),
        gpu_config("FromClaim", claims_for, burst=80),
    ]
    share = {"device": "gpu-0", "consumedCapacity": {"memory": "1Gi", "compute": "30"}}
    claim = dra.add_claim("tuned", pod, [share], config=config)
    assert prepared(plugin, claim).error == ""
    (limits,) = region_limits(dra, "tuned").values()
    assert limits == GpuLimits(memory=GiB, compute=3000, burst=8000)
    assert dra.node.store.get(NAMESPACE, "tuned").qos == 0  # low: the class's, not overridden


def test_a_claim_of_two_requests_on_one_gpu_has_a_valid_cdi_spec(
    dra: DraNode, plugin: Plugin, snapshot: NodeSnapshot
) -> None:
    """Two requests of one claim (a shared device may be allocated to each) placed on GPU 0.
    Before, the spec listed the device ``{uid}-gpu-0`` twice, and CDI refuses a whole spec that
    names a device twice ("invalid spec, multiple device"): the pod's containers did not start."""
    pod = dra.add_pod("twice")
    shares = [
        {"request": request, "device": "gpu-0", "consumedCapacity": {"memory": m, "compute": c}}
        for request, m, c in (("train", "2Gi", "20"), ("serve", "1Gi", "10"))
    ]
    claim = dra.add_claim("twice", pod, shares)
    answer = prepared(plugin, claim)
    assert answer.error == ""
    uid = claim["metadata"]["uid"]
    ids = [f"gpu.vgpu.io/claim={uid}", f"gpu.vgpu.io/claim={uid}-gpu-0"]
    assert [(list(d.request_names), list(d.cdi_device_ids)) for d in answer.devices] == [
        (["train"], ids),
        (["serve"], ids),
    ]
    names = [device["name"] for device in spec_of(dra, claim)["devices"]]
    assert names == [uid, f"{uid}-gpu-0"]
    uuid = str(snapshot.devices[0].uuid)
    assert region_limits(dra, "twice") == {uuid: GpuLimits(memory=3 * GiB, compute=3000)}
