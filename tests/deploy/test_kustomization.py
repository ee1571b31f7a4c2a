"""deploy/kubernetes as an admin applies it: `kubectl kustomize` output valid against the
Kubernetes 1.30 to 1.34 schemas, `kubectl apply -k` as docs/kubernetes.md says it, the
admission policy's CEL on the pods it must refuse and let through."""

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.apiserver import ApiServer

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
VERSIONS = ("1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0")
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def _kustomized() -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(ROOT / "deploy" / "kubernetes")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


@needs_kubectl
@pytest.mark.parametrize("version", VERSIONS)
def test_the_kustomized_manifests_validate(version: str) -> None:
    import kubernetes_validate

    documents = _kustomized()
    assert {d["kind"] for d in documents} >= {
        "DaemonSet",
        "Secret",
        "NetworkPolicy",
        "ValidatingAdmissionPolicy",
    }
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)
        scoped = "namespace" in document["metadata"]
        assert scoped == (document["kind"] not in CLUSTER_SCOPED), document["metadata"]["name"]


@needs_kubectl
def test_the_kustomization_sets_the_runtime_class_node_label_and_image() -> None:
    daemonset = next(d for d in _kustomized() if d["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {
        "vgpu/tf-hypervisor:0.1.0"
    }
    args = pod["containers"][0]["args"]
    assert not any(a.startswith("--api-open-reads") for a in args)  # every read takes the token


@needs_kubectl
def test_the_token_secret_is_made_by_kubernetes_for_an_account_without_rights() -> None:
    documents = _kustomized()
    secret = next(d for d in documents if d["kind"] == "Secret")
    assert secret["type"] == "kubernetes.io/service-account-token"
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert any(
        d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account for d in documents
    )
    bound = {
        s["name"] for d in documents if d["kind"].endswith("Binding") for s in d.get("subjects", [])
    }
    assert account not in bound
    daemonset = next(d for d in documents if d["kind"] == "DaemonSet")
    volume = next(
        v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "token"
    )
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]


@needs_kubectl
def test_the_documented_install_command_applies(tmp_path: Path) -> None:
    """docs/kubernetes.md's `kubectl apply -k …`, run as written against an API server that
    checks every object against the published schemas."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    command = re.search(r"`(kubectl apply -k [^`]+)`", text)
    assert command is not None
    assert KUBECTL is not None
    with ApiServer() as api:
        config = api.kubeconfig(tmp_path / "kubeconfig")
        result = subprocess.run(
            [KUBECTL, "--kubeconfig", str(config), *command[1].split()[1:]],
            cwd=ROOT,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},  # its cache there
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        made = {line.split()[0] for line in result.stdout.splitlines()}
        assert {
            "namespace/vgpu-system",
            "daemonset.apps/tf-hypervisor",
            "validatingadmissionpolicy.admissionregistration.k8s.io/vgpu-no-visible-devices-env",
            "networkpolicy.networking.k8s.io/tf-hypervisor",
            "secret/tf-hypervisor-token",
        } <= made
        secret = next(k for k in api.kinds if k.kind == "Secret")
        assert [s["metadata"]["name"] for s in api.objects(secret, "vgpu-system")] == [
            "tf-hypervisor-token"
        ]


# The admission policy's expressions, evaluated on pods


def _policy() -> tuple[dict[str, Any], dict[str, Any]]:
    documents = list(
        yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "admission-policy.yaml").read_text())
    )
    policy = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicy")
    binding = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicyBinding")
    return policy, binding


def _refusals(pod: dict[str, Any]) -> list[str]:
    import celpy
    from celpy.adapter import json_to_cel
    from celpy.celtypes import BoolType

    environment = celpy.Environment()
    activation = {"object": json_to_cel(pod)}
    refused = []
    for validation in _policy()[0]["spec"]["validations"]:
        program = environment.program(environment.compile(validation["expression"]))
        result = program.evaluate(activation)
        assert isinstance(result, BoolType), result  # an error would be a value, not a refusal
        if not result:
            refused.append(validation["message"])
    return refused


def _container(name: str, *env: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "busybox"}
    if env:
        container["env"] = [{"name": e, "value": "all"} for e in env]
    return container


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({"containers": [_container("main")]}, None),
        ({"containers": [_container("main", "CUDA_VISIBLE_DEVICES", "PATH")]}, None),
        (
            {"containers": [_container("main"), _container("side", "NVIDIA_VISIBLE_DEVICES")]},
            "a container",
        ),
        (
            {
                "containers": [_container("main")],
                "initContainers": [_container("init", "NVIDIA_VISIBLE_DEVICES")],
            },
            "an init container",
        ),
        (
            {
                "containers": [_container("main")],
                "ephemeralContainers": [_container("debug", "NVIDIA_VISIBLE_DEVICES")],
            },
            "an ephemeral container",
        ),
    ],
)
def test_the_admission_policy_refuses_pods_naming_their_gpus(
    spec: dict[str, Any], refused: str | None
) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    messages = _refusals(pod)
    if refused is None:
        assert messages == []
    else:
        assert len(messages) == 1 and messages[0].startswith(
            f"{refused} sets NVIDIA_VISIBLE_DEVICES"
        )


def test_the_admission_policy_spares_the_daemons_namespace() -> None:
    policy, binding = _policy()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (expression,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    namespace = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "namespace.yaml").read_text())
    label = namespace["metadata"]["labels"].get(expression["key"])
    assert expression["operator"] == "NotIn" and label in expression["values"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {r for rule in rules for r in rule["resources"]} == {"pods", "pods/ephemeralcontainers"}
