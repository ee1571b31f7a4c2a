"""deploy/kubernetes/dra: the DeviceClass and RBAC (as `kubectl kustomize` renders them) and the
example claim templates and pod validate against the Kubernetes 1.34-1.37 schemas, as does
the extended-resource component added to them; the RBAC grants what the driver calls, and the
DaemonSet patch names the base's container."""

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DRA = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "dra"
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")


def rendered(folder: Path = DRA) -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    output = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(output) if d is not None]


def examples() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DRA / "examples.yaml").read_text()) if d]


@pytest.mark.parametrize("version", VERSIONS)
def test_everything_validates_against_the_published_schemas(version: str) -> None:
    documents = rendered() + examples()
    assert {d["kind"] for d in documents} == {
        "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ResourceClaimTemplate", "Pod"
    }  # fmt: skip
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_role_grants_what_the_driver_calls() -> None:
    (role,) = [d for d in rendered() if d["kind"] == "ClusterRole"]
    rights = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    # kube.py gets claims and their pods; publish.py gets its Node, and lists, creates,
    # replaces and deletes its slice. The DRA role alone: the base role gives pods list and
    # watch, not get.
    assert ("resourceclaims", "get") in rights
    assert ("pods", "get") in rights
    assert ("nodes", "get") in rights
    for verb in ("list", "create", "update", "delete"):
        assert ("resourceslices", verb) in rights


def test_the_daemonset_patch_switches_dra_on_in_the_base_container() -> None:
    base = yaml.safe_load((DRA.parent / "daemonset.yaml").read_text())
    patch = yaml.safe_load((DRA / "daemonset-dra.yaml").read_text())
    names = {c["name"] for c in base["spec"]["template"]["spec"]["containers"]}
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container["name"] in names and patch["metadata"]["name"] == base["metadata"]["name"]
    assert {"name": "TF_HYPERVISOR_DRA", "value": "true"} in container["env"]
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {"/var/lib/kubelet/plugins": False, "/var/lib/kubelet/plugins_registry": False,
                      "/var/run/cdi": False, "/etc/cdi": True}  # fmt: skip


def with_extended_resource(overlay: Path) -> list[dict[str, Any]]:
    """The DRA objects with the extended-resource component, as a user's kustomization lists
    them (kustomize takes relative paths only)."""
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({
            "resources": [os.path.relpath(DRA, overlay)],
            "components": [os.path.relpath(DRA / "extended-resource", overlay)],
        })
    )  # fmt: skip
    return rendered(overlay)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_extended_resource_component_validates(tmp_path: Path, version: str) -> None:
    documents = with_extended_resource(tmp_path / "overlay")
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_extended_resource_component_maps_vgpu_io_gpu_to_the_class(tmp_path: Path) -> None:
    base = rendered()
    documents = with_extended_resource(tmp_path / "overlay")
    (device_class,) = [d for d in documents if d["kind"] == "DeviceClass"]
    assert device_class["spec"].pop("extendedResourceName") == "vgpu.io/gpu"
    assert documents == base  # nothing else changed; the base alone maps nothing
