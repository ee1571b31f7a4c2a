"""deploy/: every Kubernetes manifest validates offline against a pinned API schema, the
kustomization names them all, the image recipe and the systemd unit are well formed."""

import configparser
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBE = DEPLOY / "kubernetes"
# The oldest Kubernetes minor still commonly run; kubernetes-validate ships its schema, so the
# check needs no network.
KUBERNETES_VERSION = "1.31.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                found.append((f"{path.name}:{document['kind']}", document))
    return found


@pytest.mark.parametrize(("name", "document"), documents(), ids=[n for n, _ in documents()])
def test_manifest_validates_against_the_pinned_schema(name: str, document: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    import kubernetes_validate

    daemonset = next(d for n, d in documents() if n.endswith(":DaemonSet"))
    broken = yaml.safe_load(yaml.safe_dump(daemonset))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPaht"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest_and_the_image() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    manifests = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests
    images = {i["name"] for i in kustomization["images"]}
    used = {
        c["image"]
        for _, d in documents()
        if d["kind"] == "DaemonSet"
        for c in d["spec"]["template"]["spec"]["initContainers"]
        + d["spec"]["template"]["spec"]["containers"]
    }
    assert used == images


def test_daemonset_mounts_and_rights() -> None:
    daemonset = next(d for n, d in documents() if n.endswith(":DaemonSet"))
    pod = daemonset["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    # No more: with hostPID the daemon's own /proc is the host's; /dev/null names every GPU
    # to an NVIDIA runtime that takes GPUs from mounts only; the kubelet's PodResources socket
    # binds each allocation to its pod.
    assert set(host.values()) == {
        "/run/tensor-fusion/shm",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/usr/local/vgpu/lib",
        "/dev/null",
    }
    daemon = pod["containers"][0]
    mounts = {m["name"]: m for m in daemon["volumeMounts"]}
    # Host paths appear at the same paths inside: Allocate hands them to the kubelet as they are.
    for name in ("shm-base", "device-plugins", "libraries"):
        assert mounts[name]["mountPath"] == host[name]
    assert mounts["all-gpus"]["mountPath"] == "/var/run/nvidia-container-devices/all"
    assert mounts["pod-resources"]["mountPath"] == host["pod-resources"]
    assert mounts["pod-resources"]["readOnly"] is True
    assert daemon["securityContext"]["privileged"] is False
    # GPU nodes only (the label NVIDIA's GPU feature discovery sets).
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = {e["name"]: e for e in daemon["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["TF_HYPERVISOR_DEVICE_PLUGIN_LIB_DIR"]["value"] == host["libraries"]


def test_cluster_role_grants_only_what_the_daemon_uses() -> None:
    role = next(d for n, d in documents() if n.endswith(":ClusterRole"))
    grants = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # The pod source lists and watches; events are created, never patched; --token-review.
    assert grants == {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "events", "create"),
        ("authentication.k8s.io", "tokenreviews", "create"),
    }
    # The API token's account is bound to nothing.
    bindings = [d for n, d in documents() if n.endswith("Binding")]
    named = {s["name"] for b in bindings for s in b.get("subjects", [])}
    assert "tf-hypervisor-api" not in named


def test_dockerfile_is_multi_stage_and_checks_glibc_versions() -> None:
    text = (KUBE / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.MULTILINE)
    assert len(stages) == 2 and stages[0][1] == "build"
    assert "objdump -T" in text and "2.17" in text
    for source in re.findall(r"^COPY (?!--)(\S+) ", text, re.MULTILINE):
        assert (DEPLOY.parent / source).exists(), source


UNIT = DEPLOY / "systemd" / "tf-hypervisor.service"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """systemd-analyze verify where it exists (the ExecStart program pointed at a stand-in,
    since it checks that the program is there); a strict parse otherwise."""
    text = UNIT.read_text()
    program = re.search(r"^ExecStart=(\S+)", text, re.MULTILINE)
    assert program is not None and program[1].startswith("/")
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        stand_in = tmp_path / "tf-hypervisor"
        stand_in.write_text("#!/bin/sh\n")
        stand_in.chmod(0o755)
        unit = tmp_path / UNIT.name
        unit.write_text(text.replace(program[1], str(stand_in)))
        result = subprocess.run(
            [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", result.stderr  # unknown keys are only warnings
        return
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    assert set(parser.sections()) == {"Unit", "Service", "Install"}
    assert parser["Service"]["NoNewPrivileges"] == "yes"
    assert parser["Install"]["WantedBy"] == "multi-user.target"
