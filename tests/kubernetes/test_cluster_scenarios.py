"""A cluster admin's scenarios, end to end: real kubectl and the official Python client drive the
API-server stand-in; the real daemon (`tf-hypervisor daemon --kubernetes --device-plugin
--simulate`) follows it and serves the stand-in kubelet, which admits each pod as it reads it
from the API server (its containers' devices through Allocate, then PodResources lists them);
workloads run on the simulated GPU with exactly the env and mounts Allocate returned.

One node for the module (the daemon restarts in one scenario); each scenario has a namespace of
its own, made with kubectl."""

import json
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from vgpu_add_path import library_path as add_path_library
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_limiter import library_path as limiter_library

from tests.device_plugin.kubelet import Container, FakeKubelet, Pod
from tests.hypervisor.conftest import Daemon, clean_environment, wait_for
from tests.hypervisor.test_cluster_backend import driver_present, run_daemon
from tests.kubernetes.conftest import needs_kubectl, run_kubectl
from tests.support.apiserver import ApiServer
from tests.support.tenant import TenantTools, needs_root, tenant_tools

pytestmark = needs_kubectl

GiB = 1 << 30
NODE = "node-a"
GPU = "vgpu.io/gpu"
MEMORY = "vgpu.io/gpu-memory"
COMPUTE = "vgpu.io/gpu-compute"
VRAM = "tensor-fusion.ai/vram-limit"
SMALL = {GPU: "1", MEMORY: "2", COMPUTE: "5"}  # a share of one GPU: 2 GiB, 5 %
TENANT = 1000  # the non-root containers' user and group
Answers = dict[str, api_pb2.ContainerAllocateResponse]


@dataclass
class Cluster:
    api: ApiServer
    kubelet: FakeKubelet
    daemon: Daemon
    core: Any  # the official client's CoreV1Api (its classes carry no types)
    tools: TenantTools
    kubeconfig: Path

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = self.kubectl_run(*args, stdin=stdin)
        assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stderr}"
        return result.stdout

    def kubectl_run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return run_kubectl(self.kubeconfig, self.tools.root, *args, stdin=stdin)

    def namespace(self, name: str) -> None:
        """``kubectl create namespace``: the scenario's pods go there."""
        assert self.kubectl("create", "namespace", name) == f"namespace/{name} created\n"

    def create(self, namespace: str, name: str, **spec: Any) -> None:
        """``kubectl apply`` of a pod bound to the node (as the scheduler binds it)."""
        manifest = pod_manifest(namespace, name, **spec)
        applied = self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        assert applied == f"pod/{name} created\n"

    def admit(self, namespace: str, name: str) -> Answers:
        """The kubelet admits the pod it reads from the API server: each GPU container's
        Allocate answer, once the binder linked the pod's region into its folder; then it
        reports the pod running."""
        pod = self.core.read_namespaced_pod(name, namespace)
        assert pod.spec.node_name == NODE
        containers = [
            Container(c.name, vgpu_asks(c), init=True, sidecar=c.restart_policy == "Always")
            for c in pod.spec.init_containers or []
        ]
        containers += [Container(c.name, vgpu_asks(c)) for c in pod.spec.containers]
        kubelet_pod = Pod(namespace, name, pod.metadata.uid, tuple(containers))
        answers = {n: a for n, a in self.kubelet.admit(kubelet_pod).items() if a.envs}
        for answer in answers.values():
            wait_for((host_folder(answer) / "shm").exists, timeout=30)
        self.core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running"}})
        return answers

    def region(self, namespace: str, name: str) -> Path:
        return self.daemon.base / namespace / name / "shm"

    def limits(self, namespace: str, name: str) -> dict[str, tuple[int, float]]:
        """The pod's limits by GPU UUID (lower case), as the daemon's API shows them."""
        reply = self.daemon.api("GET", f"/api/v1/pods/{namespace}/{name}")
        assert reply.status_code == 200, reply.text
        return {
            g["uuid"].lower(): (g["memory_limit"], g["compute_limit"]) for g in reply.json()["gpus"]
        }

    def committed(self) -> dict[str, tuple[int, float]]:
        gpus = self.daemon.api("GET", "/api/v1/gpus").json()
        return {g["uuid"].lower(): (g["memory_committed"], g["compute_committed"]) for g in gpus}

    def gpu_of(self, namespace: str, name: str) -> str:
        """The one GPU (lower-case UUID) the kubelet gave the pod's main container."""
        (gpu,) = self.gpus_of(namespace, name)
        return gpu

    def gpus_of(self, namespace: str, name: str, container: str = "main") -> list[str]:
        """The GPUs (lower-case UUIDs) of the shares the kubelet gave the container."""
        (uid,) = [u for u, a in self.kubelet.admitted.items() if a.pod.name == name]
        shares = self.kubelet.admitted[uid].devices[container][GPU]
        return [share.rsplit("-", 1)[0].lower() for share in shares]

    def restart(self) -> None:
        stopped = self.daemon.stop()
        assert stopped == 0, self.daemon.log_file.read_text()[-3000:]
        self.daemon.start()
        self.daemon.state.chmod(0o666)
        self.kubelet.connect()  # the restarted plugin's registrations


def pod_manifest(
    namespace: str,
    name: str,
    *,
    limits: Mapping[str, str],
    init: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    security: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": NODE,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
    }
    if init is not None:
        spec["initContainers"] = [
            {"name": "warmup", "image": "busybox", "resources": {"limits": init}}
        ]
    if security is not None:
        spec["securityContext"] = security
    metadata = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def vgpu_asks(container: Any) -> dict[str, int]:
    limits = (container.resources.limits if container.resources else None) or {}
    return {name: int(count) for name, count in limits.items() if name.startswith("vgpu.io/")}


def host_folder(answer: api_pb2.ContainerAllocateResponse) -> Path:
    (folder,) = [m.host_path for m in answer.mounts if m.container_path.endswith("/shm/pod")]
    return Path(folder)


def on_host(answer: api_pb2.ContainerAllocateResponse) -> dict[str, str]:
    """Allocate's env with its container paths replaced by the host paths its mounts bind
    there (longest first), as the container sees those files."""
    mounts = sorted(((m.container_path, m.host_path) for m in answer.mounts), key=len, reverse=True)

    def mapped(value: str) -> str:
        for inside, host in mounts:
            value = value.replace(inside, host)
        return value

    return {name: mapped(value) for name, value in answer.envs.items()}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    from kubernetes import config

    # Every file under one folder that any user may read: a non-root container reaches them.
    with tenant_tools() as tools, ApiServer() as api:
        root = tools.root / "node"
        kubeconfig = api.kubeconfig(root / "kubeconfig")
        kubelet = FakeKubelet(root / "device-plugins")
        lib = root / "lib"
        lib.mkdir(mode=0o755)
        shutil.copy(add_path_library(), lib / "libadd_path.so")
        shutil.copy(limiter_library(), lib / "libcuda_limiter.so")
        daemon = Daemon(
            root,
            extra=(
                "--kubernetes",
                "--node-name", NODE,
                "--kubeconfig", str(kubeconfig),
                "--device-plugin",
                "--device-plugin-dir", str(kubelet.folder),
                "--device-plugin-lib-dir", str(lib),
                "--pod-resources-socket", str(kubelet.pod_resources),
                "--default-gpu-memory", "4GiB",
                "--default-gpu-compute", "10",
            ),
        )  # fmt: skip
        client = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]
        kubelet.start()
        try:
            daemon.start()
            daemon.state.chmod(0o666)  # the simulated GPU's device files, as every container has
            kubelet.connect()
            yield Cluster(api, kubelet, daemon, client_core(client), tools, kubeconfig)
            assert daemon.stop() == 0
        finally:
            daemon.close()
            client.close()
            kubelet.stop()


def client_core(api_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client)


def test_a_namespace_made_listed_and_deleted_with_kubectl_takes_its_pods_along(
    cluster: Cluster,
) -> None:
    """A pod needs its namespace (404 NotFound before it exists, as upstream); pods made by
    client-side and server-side apply are admitted in it and listed page by page; deleting the
    namespace deletes its pods, and the daemon lets go of them."""
    from kubernetes import client

    manifest = json.dumps(pod_manifest("team", "early", limits=SMALL))
    early = cluster.kubectl_run("apply", "-f", "-", stdin=manifest)
    assert early.returncode != 0 and 'namespaces "team" not found' in early.stderr
    with pytest.raises(client.ApiException) as refused:
        cluster.core.create_namespaced_pod("team", pod_manifest("team", "early", limits=SMALL))
    assert refused.value.status == 404
    assert json.loads(str(refused.value.body))["reason"] == "NotFound"
    cluster.namespace("team")
    assert "namespace/team" in cluster.kubectl("get", "namespaces", "-o", "name").split()
    cluster.create("team", "member", limits=SMALL)
    cluster.admit("team", "member")
    assert cluster.region("team", "member").exists()
    # A pod applied server-side (its managers recorded) is admitted as any other.
    limits = {GPU: "1", MEMORY: "3", COMPUTE: "5"}
    applied = json.dumps(pod_manifest("team", "applied", limits=limits))
    ssa = ("apply", "--server-side", "--field-manager=admin", "-f", "-")
    assert cluster.kubectl(*ssa, stdin=applied) == "pod/applied serverside-applied\n"
    cluster.admit("team", "applied")
    gpu = cluster.gpu_of("team", "applied")
    assert cluster.limits("team", "applied") == {gpu: (3 * GiB, 5.0)}
    pod = cluster.core.read_namespaced_pod("applied", "team")
    assert ("admin", "Apply") in [(m.manager, m.operation) for m in pod.metadata.managed_fields]
    listed = cluster.kubectl("get", "pods", "-n", "team", "--chunk-size=1", "-o", "name")
    assert listed.split() == ["pod/applied", "pod/member"]
    assert cluster.kubectl("delete", "namespace", "team") == 'namespace "team" deleted\n'
    assert "namespace/team" not in cluster.kubectl("get", "namespaces", "-o", "name").split()
    assert cluster.core.list_namespaced_pod("team").items == []

    def forgotten() -> bool:
        return all(
            cluster.daemon.api("GET", f"/api/v1/pods/team/{name}").status_code == 404
            for name in ("member", "applied")
        )

    assert wait_for(forgotten, timeout=30)


def test_two_pods_of_one_shape_admitted_in_reverse_order_each_get_their_own_region(
    cluster: Cluster,
) -> None:
    cluster.namespace("order")
    for name, size in (("older", "2"), ("younger", "3")):
        cluster.create("order", name, limits={GPU: "1", MEMORY: size, COMPUTE: "5"})
    answers = {"younger": cluster.admit("order", "younger")["main"]}
    # The daemon has seen the older pod (the younger one's binding came after it), but the
    # kubelet has not given it GPUs yet: it has no region, not one on every GPU.
    assert not cluster.region("order", "older").parent.exists()
    answers["older"] = cluster.admit("order", "older")["main"]
    for name, memory in (("older", 2), ("younger", 3)):
        region = cluster.region("order", name)
        assert (host_folder(answers[name]) / "shm").stat().st_ino == region.stat().st_ino
        gpu = cluster.gpu_of("order", name)
        assert cluster.limits("order", name) == {gpu: (memory * GiB, 5.0)}
    assert host_folder(answers["older"]) != host_folder(answers["younger"])


def test_a_daemon_restart_between_allocations_binds_each_to_its_own_pod(
    cluster: Cluster,
) -> None:
    """Both pods are pending when the daemon restarts; the one admitted after gets its own
    limits, not those of the one admitted before."""
    cluster.namespace("restart")
    for name, size in (("before", "2"), ("after", "3")):
        cluster.create("restart", name, limits={GPU: "1", MEMORY: size, COMPUTE: "5"})
    before = cluster.admit("restart", "before")["main"]
    cluster.restart()
    after = cluster.admit("restart", "after")["main"]
    for answer, name, memory in ((before, "before", 2), (after, "after", 3)):
        region = cluster.region("restart", name)
        assert (host_folder(answer) / "shm").stat().st_ino == region.stat().st_ino
        gpu = cluster.gpu_of("restart", name)
        assert cluster.limits("restart", name) == {gpu: (memory * GiB, 5.0)}


def test_a_pod_with_a_gpu_init_container_is_admitted_and_shares_its_region(
    cluster: Cluster,
) -> None:
    cluster.namespace("staged")
    cluster.create("staged", "staged", limits=SMALL, init={GPU: "1"})
    answers = cluster.admit("staged", "staged")
    assert set(answers) == {"warmup", "main"}
    assert host_folder(answers["warmup"]) != host_folder(answers["main"])
    region = cluster.region("staged", "staged").stat().st_ino
    assert {(host_folder(a) / "shm").stat().st_ino for a in answers.values()} == {region}
    gpu = cluster.gpu_of("staged", "staged")
    assert cluster.limits("staged", "staged") == {gpu: (2 * GiB, 5.0)}


def test_a_gpu_sidecar_alone_is_charged_and_limited_as_it_asks(cluster: Cluster) -> None:
    # A sidecar (an init container with restartPolicy Always) asking for the share, the main
    # container for none: the pod's effective request is the sidecar's, as Kubernetes counts.
    cluster.namespace("side")
    manifest = pod_manifest("side", "proxy", limits={})
    manifest["spec"]["initContainers"] = [
        {"name": "proxy", "image": "busybox", "restartPolicy": "Always",
         "resources": {"limits": SMALL}}
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    before = cluster.committed()
    assert set(cluster.admit("side", "proxy")) == {"proxy"}
    (gpu,) = cluster.gpus_of("side", "proxy", container="proxy")
    assert cluster.limits("side", "proxy") == {gpu: (2 * GiB, 5.0)}
    memory, compute = cluster.committed()[gpu]
    assert (memory - before[gpu][0], compute - before[gpu][1]) == (2 * GiB, 5.0)


def test_a_plain_init_containers_ask_counts_as_kubernetes_counts_it(cluster: Cluster) -> None:
    # The init container asks for memory and compute, the main container only for the GPU:
    # the pod's request is the larger of the two, not the daemon's defaults.
    cluster.namespace("warm")
    cluster.create("warm", "warm", limits={GPU: "1"}, init=SMALL)
    assert set(cluster.admit("warm", "warm")) == {"warmup", "main"}
    gpu = cluster.gpu_of("warm", "warm")
    assert cluster.limits("warm", "warm") == {gpu: (2 * GiB, 5.0)}


def test_a_two_gpu_pod_gets_two_distinct_gpus(cluster: Cluster) -> None:
    cluster.namespace("pair")
    cluster.create("pair", "pair", limits={GPU: "2", MEMORY: "2", COMPUTE: "5"})
    cluster.admit("pair", "pair")
    given = cluster.gpus_of("pair", "pair")
    assert len(given) == 2 and len(set(given)) == 2
    limits = cluster.limits("pair", "pair")
    assert sorted(limits) == sorted(given)
    assert set(limits.values()) == {(2 * GiB, 5.0)}


def test_a_pod_asking_only_for_a_gpu_gets_the_default_limits_and_is_charged_them(
    cluster: Cluster,
) -> None:
    cluster.namespace("plain")
    cluster.create("plain", "plain", limits={GPU: "1"})
    charged = cluster.committed()
    cluster.admit("plain", "plain")
    uuid = cluster.gpu_of("plain", "plain")
    gpus = cluster.daemon.api("GET", "/api/v1/gpus").json()
    (index,) = [g["index"] for g in gpus if g["uuid"].lower() == uuid]
    assert cluster.limits("plain", "plain") == {uuid: (4 * GiB, 10.0)}
    memory, compute = charged[uuid]
    wait_for(lambda: cluster.committed()[uuid] == (memory + 4 * GiB, compute + 10.0), timeout=15)
    shown = cluster.daemon.cli("gpus")
    assert shown.returncode == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if line.split()[:1] == [str(index)]]
    assert f" {(memory + 4 * GiB) / GiB:.1f} GiB, {compute + 10:g}% " in row, shown.stdout


def test_an_annotation_raise_is_refused_and_the_region_keeps_the_lower_limit(
    cluster: Cluster,
) -> None:
    cluster.namespace("raise")
    cluster.create("raise", "greedy", limits=SMALL, annotations={VRAM: "1Gi"})
    cluster.admit("raise", "greedy")
    gpu = cluster.gpu_of("raise", "greedy")
    assert cluster.limits("raise", "greedy") == {gpu: (1 * GiB, 5.0)}
    cluster.kubectl("annotate", "pod", "greedy", "-n", "raise", f"{VRAM}=8Gi", "--overwrite")

    def refusals() -> list[str]:
        events = cluster.core.list_namespaced_event("raise").items
        return [e.message for e in events if e.reason == "LimitRaiseRefused"]

    (refused,) = wait_for(refusals, timeout=15)
    assert "tensor-fusion.ai/vram-limit='8Gi'" in refused
    # The resources' 2 GiB hold, never the annotation's 8 GiB.
    wait_for(lambda: cluster.limits("raise", "greedy") == {gpu: (2 * GiB, 5.0)})
    cluster.kubectl("annotate", "pod", "greedy", "-n", "raise", f"{VRAM}=1Gi", "--overwrite")
    wait_for(lambda: cluster.limits("raise", "greedy") == {gpu: (1 * GiB, 5.0)})


@needs_root
def test_a_non_root_container_runs_under_its_limit_with_exactly_allocates_answer(
    cluster: Cluster,
) -> None:
    cluster.namespace("tenant")
    security = {"runAsUser": TENANT, "runAsGroup": TENANT}
    cluster.create("tenant", "tenant", limits=SMALL, security=security)
    answer = cluster.admit("tenant", "tenant")["main"]
    region = cluster.region("tenant", "tenant").stat()
    assert (region.st_uid, region.st_gid, region.st_mode & 0o777) == (TENANT, TENANT, 0o660)

    def run(size: str) -> dict[str, Any]:
        # The simulated GPU's libraries (the container's driver), then Allocate's env as is.
        sim = {"VGPU_SIM_STATE": str(cluster.daemon.state)}
        environment = cluster.tools.environment(clean_environment() | sim) | on_host(answer)
        workload = cluster.tools.run_as_tenant(
            [str(cluster.tools.workload), "--kernels", "1", "--alloc", size],
            environment,
            user=TENANT,
        )
        stdout, stderr = workload.communicate(timeout=60)
        assert stdout, stderr
        report: dict[str, Any] = json.loads(stdout)
        return report

    fits = run("1GiB")
    assert fits.get("error") is None, fits
    assert fits["total_bytes"] == 2 * GiB  # the region's limit, seen as the GPU's memory
    refused = run("3GiB")
    assert refused["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2", refused


@pytest.mark.skipif(driver_present(), reason="this machine has the NVIDIA driver")
def test_in_a_cluster_without_the_driver_the_daemon_refuses_to_start(
    cluster: Cluster, tmp_path: Path
) -> None:
    """As a pod (the cluster's service variables set), without --simulate: one line, and
    nothing served."""
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    flags = (
        "--node-name", NODE,
        "--kubeconfig", str(cluster.kubeconfig),
        "--device-plugin",
        "--device-plugin-dir", str(plugins),
    )  # fmt: skip
    in_cluster = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    result = run_daemon(tmp_path, *flags, environment=in_cluster)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert "no NVIDIA driver" in result.stderr and "--simulate" in result.stderr
    assert not list(plugins.iterdir())
    assert not (tmp_path / "shm" / ".node").exists()
