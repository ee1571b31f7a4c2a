"""Server-side apply and paged lists on the API-server stand-in, driven by real kubectl
(``kubectl apply --server-side``, ``kubectl get --chunk-size``) and the official Python client."""

import json
from typing import Any

import pytest

from tests.kubernetes.conftest import Kubectl, needs_kubectl
from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import POD

SETTINGS = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  labels: {team: ml}
data:
  mode: fast
  level: "3"
"""


def _fields(api: ApiServer, name: str) -> dict[str, Any]:
    """The configmap's managers: manager name → (operation, its FieldsV1)."""
    kind = next(k for k in api.kinds if k.plural == "configmaps")
    entries = api.store.get(kind, "default", name)["metadata"].get("managedFields", [])
    return {e["manager"]: (e["operation"], e["fieldsV1"]) for e in entries}


@needs_kubectl
def test_kubectl_server_side_apply_merges_owns_and_removes(
    kubectl: Kubectl, api: ApiServer
) -> None:
    made = kubectl("apply", "--server-side", "-f", "-", stdin=SETTINGS).stdout
    assert made == "configmap/settings serverside-applied\n"
    shown = json.loads(
        kubectl("get", "cm", "settings", "-o", "json", "--show-managed-fields").stdout
    )
    assert shown["data"] == {"mode": "fast", "level": "3"}
    (entry,) = shown["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["fieldsType"]) == (
        "kubectl",
        "Apply",
        "FieldsV1",
    )
    assert entry["fieldsV1"] == {
        "f:data": {".": {}, "f:level": {}, "f:mode": {}},
        "f:metadata": {"f:labels": {".": {}, "f:team": {}}},
    }
    version = shown["metadata"]["resourceVersion"]
    kubectl("apply", "--server-side", "-f", "-", stdin=SETTINGS)  # the same again: a no-op
    assert _version(kubectl, "settings") == version
    # A field the manager applies no more goes; one it adds comes.
    fewer = SETTINGS.replace('  level: "3"\n', "  size: big\n")
    kubectl("apply", "--server-side", "-f", "-", stdin=fewer)
    data = json.loads(kubectl("get", "cm", "settings", "-o", "json").stdout)["data"]
    assert data == {"mode": "fast", "size": "big"}


@needs_kubectl
def test_kubectl_server_side_apply_conflicts_name_the_owner_until_forced(
    kubectl: Kubectl, api: ApiServer
) -> None:
    kubectl("create", "configmap", "settings", "--from-literal=mode=fast")
    assert _fields(api, "settings")["kubectl-create"][0] == "Update"
    other = SETTINGS.replace("mode: fast", "mode: slow")
    refused = kubectl("apply", "--server-side", "-f", "-", stdin=other, ok=False)
    assert refused.returncode != 0
    assert (
        'Apply failed with 1 conflict: conflict with "kubectl-create" using v1: .data.mode'
        in refused.stderr
    )
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=other)
    data = json.loads(kubectl("get", "cm", "settings", "-o", "json").stdout)["data"]
    assert data == {"mode": "slow", "level": "3"}
    managers = _fields(api, "settings")
    assert managers["kubectl-create"] == ("Update", {"f:data": {".": {}}})  # the map alone
    assert managers["kubectl"][1]["f:data"] == {".": {}, "f:level": {}, "f:mode": {}}
    # Applying a field's current value shares it: no conflict.
    shared = SETTINGS.replace("mode: fast", "mode: slow")
    kubectl("apply", "--server-side", "--field-manager=ops", "-f", "-", stdin=shared)
    assert set(_fields(api, "settings")) == {"kubectl", "kubectl-create", "ops"}
    # Applied again as it was, with other managers after it: a no-op, its entry where it was.
    version, order = _version(kubectl, "settings"), list(_fields(api, "settings"))
    kubectl("apply", "--server-side", "-f", "-", stdin=other)
    assert (_version(kubectl, "settings"), list(_fields(api, "settings"))) == (version, order)
    assert _fields(api, "settings")["ops"][1]["f:data"] == {".": {}, "f:mode": {}, "f:level": {}}


@needs_kubectl
def test_kubectl_server_side_apply_merges_lists_by_their_keys(
    kubectl: Kubectl, api: ApiServer
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "nodeName": "node-a",
            "containers": [
                {"name": "main", "image": "busybox", "env": [{"name": "A", "value": "1"}]}
            ],
        },
    }
    kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(pod))
    # Another manager's patch of one container's image: the list merges by name.
    kubectl("set", "image", "pod/p", "main=busybox:1.37")
    stored = api.store.get(POD, "default", "p")
    assert stored["spec"]["containers"][0]["image"] == "busybox:1.37"
    assert stored["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert stored["status"]["phase"] == "Pending"  # the status is not the apply's
    managers = {e["manager"]: e for e in stored["metadata"]["managedFields"]}
    image = managers["kubectl-set"]["fieldsV1"]["f:spec"]["f:containers"]['k:{"name":"main"}']
    assert image == {"f:image": {}}


@needs_kubectl
def test_a_quantity_applied_as_a_number_is_the_stored_string(
    kubectl: Kubectl, api: ApiServer
) -> None:
    """``vgpu.io/gpu: 1`` and the stored ``"1"`` are one value: no conflict with its owner."""
    container = {"name": "main", "image": "busybox", "resources": {"limits": {"vgpu.io/gpu": 1}}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "q", "namespace": "default"},
        "spec": {"nodeName": "node-a", "containers": [container]},
    }
    kubectl("create", "-f", "-", stdin=json.dumps(pod))
    shared = kubectl("apply", "--server-side", "--field-manager=ops", "-f", "-",
                     stdin=json.dumps(pod), ok=False)  # fmt: skip
    assert shared.returncode == 0, shared.stderr
    limits = api.store.get(POD, "default", "q")["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"vgpu.io/gpu": "1"}


@needs_kubectl
def test_an_atomic_object_is_applied_and_owned_whole(kubectl: Kubectl, api: ApiServer) -> None:
    """A label selector is atomic: taken over, it is the new one, not the two merged."""
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "only", "namespace": "default"},
        "spec": {"podSelector": {"matchLabels": {"app": "a"}}},
    }
    kubectl("apply", "--server-side", "--field-manager=one", "-f", "-", stdin=json.dumps(policy))
    policy["spec"] = {"podSelector": {"matchLabels": {"tier": "x"}}}
    refused = kubectl("apply", "--server-side", "--field-manager=two", "-f", "-",
                      stdin=json.dumps(policy), ok=False)  # fmt: skip
    assert 'conflict with "one" using networking.k8s.io/v1: .spec.podSelector' in refused.stderr
    kubectl("apply", "--server-side", "--field-manager=two", "--force-conflicts", "-f", "-",
            stdin=json.dumps(policy))  # fmt: skip
    shown = json.loads(
        kubectl("get", "netpol", "only", "-o", "json", "--show-managed-fields").stdout
    )
    assert shown["spec"]["podSelector"] == {"matchLabels": {"tier": "x"}}
    owners = {e["manager"]: e["fieldsV1"] for e in shown["metadata"]["managedFields"]}
    assert owners == {"two": {"f:spec": {"f:podSelector": {}}}}


def _version(kubectl: Kubectl, name: str) -> str:
    shown = json.loads(kubectl("get", "cm", name, "-o", "json").stdout)
    version: str = shown["metadata"]["resourceVersion"]
    return version


def test_python_client_applies_and_is_told_what_apply_needs(core: Any, api: ApiServer) -> None:
    from kubernetes import client

    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default"},
        "data": {"mode": "fast"},
    }
    apply = "application/apply-patch+yaml"
    made = core.patch_namespaced_config_map(
        "settings", "default", config, field_manager="trainer", _content_type=apply
    )
    assert made.data == {"mode": "fast"}
    assert [(m.manager, m.operation) for m in made.metadata.managed_fields] == [
        ("trainer", "Apply")
    ]
    for bad, code, reason in (
        ({}, 422, "Invalid"),  # no field manager
        ({"field_manager": "trainer", "name": "other"}, 400, "BadRequest"),  # another name
    ):
        name = bad.pop("name", "settings")
        with pytest.raises(client.ApiException) as refused:
            core.patch_namespaced_config_map(name, "default", config, _content_type=apply, **bad)
        status = json.loads(str(refused.value.body))
        assert (refused.value.status, status["kind"], status["reason"]) == (code, "Status", reason)
    with pytest.raises(client.ApiException) as nowhere:
        core.patch_namespaced_config_map(
            "settings", "nope", {**config, "metadata": {"name": "settings", "namespace": "nope"}},
            field_manager="trainer", _content_type=apply,
        )  # fmt: skip
    assert nowhere.value.status == 404
    assert json.loads(str(nowhere.value.body))["message"] == 'namespaces "nope" not found'


# Paged lists


@needs_kubectl
def test_kubectl_lists_in_chunks(kubectl: Kubectl, api: ApiServer) -> None:
    for name in ("a", "b", "c"):
        kubectl("create", "configmap", name, f"--from-literal=k={name}")
    listed = kubectl("get", "configmaps", "--chunk-size=1", "-o", "name").stdout.split()
    assert listed == ["configmap/a", "configmap/b", "configmap/c"]
    pages = [r for r in api.requests if r.startswith("GET /api/v1/namespaces/default/configmaps?")]
    assert len(pages) == 3 and sum("continue=" in r for r in pages) == 2
    table = kubectl("get", "configmaps", "--chunk-size=2").stdout.split("\n")
    assert [line.split()[0] for line in table if line] == ["NAME", "a", "b", "c"]


def test_python_client_pages_see_the_lists_moment(core: Any, api: ApiServer) -> None:
    from kubernetes import client

    for name in ("a", "b", "c", "d"):
        core.create_namespaced_config_map("default", {"metadata": {"name": name}})
    first = core.list_namespaced_config_map("default", limit=2)
    assert [c.metadata.name for c in first.items] == ["a", "b"]
    assert first.metadata.remaining_item_count == 2 and first.metadata._continue
    # Changes after the first page do not show on the next: it is the same list.
    core.delete_namespaced_config_map("c", "default")
    core.create_namespaced_config_map("default", {"metadata": {"name": "bb"}})
    rest = core.list_namespaced_config_map("default", limit=2, _continue=first.metadata._continue)
    assert [c.metadata.name for c in rest.items] == ["c", "d"]
    assert rest.metadata._continue is None and rest.metadata.resource_version == (
        first.metadata.resource_version
    )
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == [
        "a",
        "b",
        "bb",
        "d",
    ]
    # A token whose moment is compacted away is 410 Expired; one the server never gave, 400.
    token = core.list_namespaced_config_map("default", limit=1).metadata._continue
    api.expire()
    with pytest.raises(client.ApiException) as expired:
        core.list_namespaced_config_map("default", limit=1, _continue=token)
    assert expired.value.status == 410
    assert json.loads(str(expired.value.body))["reason"] == "Expired"
    for bad in ("not-a-token", token[:-4]):
        with pytest.raises(client.ApiException) as invalid:
            core.list_namespaced_config_map("default", _continue=bad)
        assert invalid.value.status == 400
    with pytest.raises(client.ApiException) as negative:
        core.list_namespaced_config_map("default", limit=-1)
    assert negative.value.status == 400
