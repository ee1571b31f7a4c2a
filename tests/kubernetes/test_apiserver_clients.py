"""The API-server stand-in driven by real clients: kubectl (as a cluster admin types it), the
official Python client, and the daemon's pod source (lightkube) seeing what they made."""

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.hypervisor.conftest import Daemon, wait_for
from tests.kubernetes.conftest import Kubectl, needs_kubectl
from tests.support.apiserver import ApiServer, Kind
from tests.support.apiserver.kinds import NAMESPACE as NAMESPACE_KIND

NAMESPACE_AND_POD = """\
apiVersion: v1
kind: Namespace
metadata:
  name: ml
---
apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: ml
  labels: {app: train}
  annotations:
    tensor-fusion.ai/vram-limit: 2Gi
spec:
  nodeName: node-a
  containers:
    - name: main
      image: busybox
      resources:
        limits:
          vgpu.io/gpu: 1
"""


@needs_kubectl
def test_kubectl_applies_gets_annotates_and_deletes(kubectl: Kubectl, api: ApiServer) -> None:
    assert "namespace/ml created" in kubectl("apply", "-f", "-", stdin=NAMESPACE_AND_POD).stdout
    pod = json.loads(kubectl("get", "pod", "train", "-n", "ml", "-o", "json").stdout)
    assert pod["metadata"]["uid"] and pod["metadata"]["resourceVersion"].isdigit()
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"vgpu.io/gpu": "1"}
    assert pod["status"]["phase"] == "Pending"
    # Applied again unchanged: nothing changes; a changed image is a (strategic merge) patch.
    kubectl("apply", "-f", "-", stdin=NAMESPACE_AND_POD)
    assert (
        api.pods[("ml", "train")]["metadata"]["resourceVersion"]
        == pod["metadata"]["resourceVersion"]
    )
    kubectl("apply", "-f", "-", stdin=NAMESPACE_AND_POD.replace("busybox", "busybox:1.37"))
    assert api.pods[("ml", "train")]["spec"]["containers"][0]["image"] == "busybox:1.37"
    assert (
        api.pods[("ml", "train")]["metadata"]["annotations"]["tensor-fusion.ai/vram-limit"] == "2Gi"
    )
    # A pod's resources cannot change, as upstream.
    refused = kubectl(
        "apply", "-f", "-", stdin=NAMESPACE_AND_POD.replace("gpu: 1", "gpu: 2"), ok=False
    )
    assert refused.returncode != 0 and "pod updates may not change fields" in refused.stderr
    kubectl(
        "annotate", "pod", "train", "-n", "ml", "tensor-fusion.ai/vram-limit=1Gi", "--overwrite"
    )
    limit = kubectl(
        "get",
        "pod",
        "train",
        "-n",
        "ml",
        "-o",
        "jsonpath={.metadata.annotations.tensor-fusion\\.ai/vram-limit}",
    ).stdout
    assert limit == "1Gi"
    names = kubectl("get", "pods", "-n", "ml", "-l", "app=train", "-o", "name").stdout.split()
    assert names == ["pod/train"]
    assert kubectl("get", "pods", "-n", "ml", "-l", "app=other", "-o", "name").stdout == ""
    # Deleting waits for the node to stop the pod (graceful deletion), then it is gone.
    assert 'pod "train" deleted' in kubectl("delete", "pod", "train", "-n", "ml").stdout
    assert ("ml", "train") not in api.pods
    missing = kubectl("get", "pod", "train", "-n", "ml", ok=False)
    assert missing.returncode != 0 and 'pods "train" not found' in missing.stderr


@needs_kubectl
def test_kubectl_refuses_what_the_schema_refuses(kubectl: Kubectl, api: ApiServer) -> None:
    typo = NAMESPACE_AND_POD.replace("      image: busybox", "      imag: busybox")
    unknown = kubectl("apply", "-f", "-", stdin=typo, ok=False)
    assert unknown.returncode != 0
    assert 'unknown field "spec.containers[0].imag"' in unknown.stderr
    nameless = NAMESPACE_AND_POD.replace("    - name: main\n      image", "    - image")
    invalid = kubectl("apply", "-f", "-", stdin=nameless, ok=False)
    assert invalid.returncode != 0
    assert "spec.containers[0].name" in invalid.stderr and "is invalid" in invalid.stderr
    assert ("ml", "train") not in api.pods
    no_namespace = NAMESPACE_AND_POD.split("---\n")[1].replace("namespace: ml", "namespace: nope")
    absent = kubectl("apply", "-f", "-", stdin=no_namespace, ok=False)
    assert 'namespaces "nope" not found' in absent.stderr


@needs_kubectl
def test_kubectl_creates_lists_and_deletes_namespaces(kubectl: Kubectl, api: ApiServer) -> None:
    """``kubectl create`` of built-in kinds sends protobuf; what it made reads back as JSON."""
    assert kubectl("create", "namespace", "team").stdout == "namespace/team created\n"
    made = json.loads(kubectl("get", "namespace", "team", "-o", "json").stdout)
    assert made["status"]["phase"] == "Active"
    assert made["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team"}
    names = kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/team"} <= set(names)
    kubectl("create", "configmap", "settings", "-n", "team", "--from-literal=mode=fast")
    kubectl("create", "secret", "generic", "token", "-n", "team", "--from-literal=key=s3cret")
    kubectl("create", "serviceaccount", "runner", "-n", "team")
    kubectl("create", "service", "clusterip", "web", "-n", "team", "--tcp=80:8080")
    secret = json.loads(kubectl("get", "secret", "token", "-n", "team", "-o", "json").stdout)
    assert secret["data"] == {"key": "czNjcmV0"}  # base64, as JSON carries bytes
    service = json.loads(kubectl("get", "service", "web", "-n", "team", "-o", "json").stdout)
    assert service["spec"]["ports"][0]["port"] == 80
    assert service["spec"]["ports"][0]["targetPort"] == 8080
    assert api.store.get(NAMESPACE_KIND, None, "team")["metadata"]["uid"]
    taken = kubectl("create", "namespace", "team", ok=False)
    assert 'namespaces "team" already exists' in taken.stderr
    # Deleting a namespace deletes what is in it, then the namespace.
    assert 'namespace "team" deleted' in kubectl("delete", "namespace", "team").stdout
    assert "namespace/team" not in kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert kubectl("get", "configmaps", "-n", "team", "-o", "name").stdout == ""
    gone = kubectl("get", "namespace", "team", ok=False)
    assert gone.returncode != 0 and 'namespaces "team" not found' in gone.stderr
    orphan = kubectl("create", "configmap", "late", "-n", "team", ok=False)
    assert 'namespaces "team" not found' in orphan.stderr


@needs_kubectl
def test_kubectl_watch_sees_changes_and_ends_when_asked(kubectl: Kubectl, api: ApiServer) -> None:
    kubectl("apply", "-f", "-", stdin=NAMESPACE_AND_POD)
    outcome: dict[str, subprocess.CompletedProcess[str]] = {}
    watcher = threading.Thread(
        target=lambda: outcome.setdefault(
            "watch",
            kubectl(
                "get",
                "pods",
                "-n",
                "ml",
                "-w",
                "--output-watch-events",
                "-o",
                "json",
                "--request-timeout=6s",
            ),
        )
    )
    watcher.start()
    wait_for(lambda: any("watch=true" in r and "/namespaces/ml/pods" in r for r in api.requests))
    kubectl("annotate", "pod", "train", "-n", "ml", "seen=yes")
    kubectl("delete", "pod", "train", "-n", "ml")
    watcher.join(timeout=30)
    assert not watcher.is_alive(), "the watch did not end at its timeout"
    decoder, text, events = json.JSONDecoder(), outcome["watch"].stdout, []
    while text.strip():
        event, end = decoder.raw_decode(text.lstrip())
        events.append(event)
        text = text.lstrip()[end:]
    kinds = [(e["type"], bool(e["object"]["metadata"].get("deletionTimestamp"))) for e in events]
    assert kinds[0] == ("ADDED", False) and kinds[-1][0] == "DELETED"
    assert ("MODIFIED", True) in kinds  # graceful deletion: terminating, then gone
    annotated = [e for e in events if e["object"]["metadata"].get("annotations", {}).get("seen")]
    assert annotated and annotated[0]["type"] == "MODIFIED"


@needs_kubectl
def test_kubectl_discovers_the_served_kinds(kubectl: Kubectl, api: ApiServer) -> None:
    resources = kubectl("api-resources", "-o", "name").stdout.split()
    assert {
        "pods",
        "namespaces",
        "events",
        "resourceclaims.resource.k8s.io",
        "resourceslices.resource.k8s.io",
        "deviceclasses.resource.k8s.io",
    } <= set(resources)
    assert "resource.k8s.io/v1" in kubectl("api-versions").stdout.split()
    assert kubectl("get", "resourceclaims", "-A", "-o", "name").stdout == ""


def test_a_kind_is_served_once_registered(tmp_path: Path) -> None:
    with ApiServer() as api:
        api.register(
            Kind(
                "scheduling.k8s.io",
                "v1",
                "PriorityClass",
                "priorityclasses",
                namespaced=False,
                short_names=("pc",),
            )
        )
        import httpx

        with httpx.Client(base_url=api.url) as http:
            assert (
                http.get("/apis/scheduling.k8s.io/v1").json()["resources"][0]["name"]
                == "priorityclasses"
            )
            made = http.post(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                json={
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": "high"},
                    "value": 1000,
                },
            )
            assert made.status_code == 201, made.text
            bad = http.post(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                json={
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": "low"},
                    "value": "high",
                },
            )
            # A value of the wrong type does not decode (400), as upstream.
            assert bad.status_code == 400 and bad.json()["reason"] == "BadRequest"
            assert "value" in bad.json()["message"]
        with pytest.raises(ValueError, match="no schema"):
            api.register(Kind("example.com", "v1", "Widget", "widgets"))


# The official Python client


POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "labels": {"app": "x"}},
    "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox"}]},
}


def _watch() -> Any:
    """The client's watch helper (its functions carry no types)."""
    from kubernetes import watch

    return watch.Watch()  # type: ignore[no-untyped-call]


def test_python_client_creates_patches_and_watches(core: Any, api: ApiServer) -> None:
    core.create_namespace({"metadata": {"name": "py"}})
    made = core.create_namespaced_pod("py", POD)
    listed = core.list_namespaced_pod("py", label_selector="app=x")
    assert [p.metadata.name for p in listed.items] == ["p"]
    assert listed.metadata.resource_version == made.metadata.resource_version
    # Strategic merge (the client's default for an object), JSON merge and JSON patch.
    core.patch_namespaced_pod("p", "py", {"metadata": {"annotations": {"a": "1", "z": "0"}}})
    core.patch_namespaced_pod("p", "py", {"metadata": {"annotations": {"z": None}}},
                              _content_type="application/merge-patch+json")  # fmt: skip
    core.patch_namespaced_pod(
        "p", "py", [{"op": "add", "path": "/metadata/labels/b", "value": "2"}]
    )
    # pods/status: conditions merge by their type (the schema's merge key).
    for condition in (
        {"type": "Ready", "status": "False"},
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "True"},
    ):
        core.patch_namespaced_pod_status(
            "p", "py", {"status": {"phase": "Running", "conditions": [condition]}}
        )
    now = core.read_namespaced_pod("p", "py")
    assert now.metadata.annotations == {"a": "1"} and now.metadata.labels == {"app": "x", "b": "2"}
    assert {c.type: c.status for c in now.status.conditions} == {
        "Ready": "True",
        "Initialized": "True",
    }
    # The main resource keeps status as it is; pods/status keeps the rest.
    core.patch_namespaced_pod("p", "py", {"status": {"phase": "Failed"}})
    assert core.read_namespaced_pod("p", "py").status.phase == "Running"
    # A watch from the list's version sees every change after it, then ends at its timeout.
    stream = _watch().stream(
        core.list_namespaced_pod,
        "py",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=2,
    )
    seen = [(e["type"], e["object"].status.phase) for e in stream]
    # Three patches, three of the status; the status sent to the main resource changed nothing.
    assert [t for t, _ in seen] == ["MODIFIED"] * 6 and seen[-1][1] == "Running"


def test_python_client_meets_conflicts_gone_and_graceful_deletion(
    core: Any, api: ApiServer
) -> None:
    from kubernetes import client

    made = core.create_namespaced_pod("default", POD)
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "1"}}})
    stale = made
    stale.metadata.annotations = {"a": "2"}
    with pytest.raises(client.ApiException) as conflict:
        core.replace_namespaced_pod("p", "default", stale)
    assert conflict.value.status == 409
    with pytest.raises(client.ApiException) as exists:
        core.create_namespaced_pod("default", POD)
    assert (
        exists.value.status == 409
        and json.loads(str(exists.value.body))["reason"] == "AlreadyExists"
    )
    with pytest.raises(client.ApiException) as nowhere:
        core.create_namespaced_pod("nope", POD)
    assert nowhere.value.status == 404
    assert json.loads(str(nowhere.value.body)) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'namespaces "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "namespaces"},
        "code": 404,
    }
    api.expire()
    with pytest.raises(client.ApiException) as gone:
        list(
            _watch().stream(
                core.list_namespaced_pod,
                "default",
                resource_version=made.metadata.resource_version,
                timeout_seconds=2,
            )
        )
    assert gone.value.status == 410
    # A finalizer holds a deleted pod until it is removed; the node stops it meanwhile.
    core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": ["example.com/hold"]}})
    deleting = core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert deleting.metadata.deletion_timestamp is not None
    assert core.read_namespaced_pod("p", "default").metadata.finalizers == ["example.com/hold"]
    core.patch_namespaced_pod("p", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(client.ApiException) as deleted:
        core.read_namespaced_pod("p", "default")
    assert deleted.value.status == 404


def test_bookmarks_and_initial_events(api: ApiServer) -> None:
    import httpx

    api.put_pod("one")
    params = {
        "watch": "true",
        "allowWatchBookmarks": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "timeoutSeconds": "3",
    }
    with httpx.Client(base_url=api.url, timeout=10) as http:
        lines = http.get("/api/v1/namespaces/default/pods", params=params).text.splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "one"
    end = events[1]
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert any(
        e["type"] == "BOOKMARK" and "annotations" not in e["object"]["metadata"] for e in events[2:]
    )


# The daemon's pod source (lightkube) following what kubectl does


@needs_kubectl
def test_the_pod_source_follows_pods_made_with_kubectl(
    tmp_path: Path, api: ApiServer, kubectl: Kubectl
) -> None:
    flags = (
        "--kubernetes",
        "--node-name",
        "node-a",
        "--kubeconfig",
        str(api.kubeconfig(tmp_path / "daemon-kubeconfig")),
    )
    daemon = Daemon(tmp_path / "node", extra=flags)
    daemon.start()
    try:
        kubectl("apply", "-f", "-", stdin=NAMESPACE_AND_POD)

        def limit() -> int | None:
            reply = daemon.http.get("/api/v1/pods/ml/train")
            if reply.status_code != 200 or not reply.json()["gpus"]:
                return None
            memory: int = reply.json()["gpus"][0]["memory_limit"]
            return memory

        assert wait_for(lambda: limit() == 2 << 30, timeout=20)
        kubectl(
            "annotate", "pod", "train", "-n", "ml", "tensor-fusion.ai/vram-limit=1Gi", "--overwrite"
        )
        assert wait_for(lambda: limit() == 1 << 30, timeout=20)
        kubectl("delete", "namespace", "ml")
        assert wait_for(
            lambda: daemon.http.get("/api/v1/pods/ml/train").status_code == 404, timeout=20
        )
        assert not (daemon.base / "ml" / "train").exists()
    finally:
        daemon.close()
