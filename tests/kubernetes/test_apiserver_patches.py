"""The stand-in's patches against the published schemas' merge keys, and their errors."""

from typing import Any

import httpx
import pytest

from tests.support.apiserver import ApiServer
from tests.support.apiserver.kinds import POD
from tests.support.apiserver.patch import PatchError, json_patch, merge_patch, strategic_merge
from tests.support.apiserver.schemas import Schemas

SCHEMAS = Schemas("1.34.0")
SPEC = {
    "containers": [
        {"name": "a", "image": "one", "env": [{"name": "X", "value": "1"}]},
        {"name": "b", "image": "two"},
    ],
    "tolerations": [{"key": "k", "operator": "Exists"}],
}


def _pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "finalizers": ["f/one", "f/two"]}, "spec": spec}


def _smp(patch: dict[str, Any]) -> Any:
    return strategic_merge(_pod(SPEC), patch, SCHEMAS.root(POD), SCHEMAS.resolve)


def test_strategic_merge_merges_lists_by_their_key() -> None:
    merged = _smp({"spec": {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]},
                                           {"name": "c", "image": "three"}]}})  # fmt: skip
    containers = merged["spec"]["containers"]
    assert [c["name"] for c in containers] == ["a", "b", "c"]
    assert containers[0]["image"] == "one"
    assert containers[0]["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]


def test_strategic_merge_replaces_atomic_lists_and_obeys_directives() -> None:
    # tolerations have no merge key: the patch's list replaces the object's.
    assert _smp({"spec": {"tolerations": []}})["spec"]["tolerations"] == []
    gone = _smp({"spec": {"containers": [{"name": "b", "$patch": "delete"}]}})
    assert [c["name"] for c in gone["spec"]["containers"]] == ["a"]
    replaced = _smp({"spec": {"containers": [{"$patch": "replace"}, {"name": "z", "image": "z"}]}})
    assert replaced["spec"]["containers"] == [{"name": "z", "image": "z"}]
    fewer = _smp({"metadata": {"$deleteFromPrimitiveList/finalizers": ["f/one"]}})
    assert fewer["metadata"]["finalizers"] == ["f/two"]
    more = _smp({"metadata": {"finalizers": ["f/three"]}})
    assert more["metadata"]["finalizers"] == ["f/one", "f/two", "f/three"]
    kept = _smp({"spec": {"$retainKeys": ["containers"], "containers": []}})
    assert set(kept["spec"]) == {"containers"}
    with pytest.raises(PatchError, match="has no 'name'"):
        _smp({"spec": {"containers": [{"image": "x"}]}})


def test_merge_and_json_patches() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": None}, "d": [2]}) == {
        "a": {"c": 2},
        "d": [2],
    }
    document = {"a": [1, 2], "b": {"c": "x"}}
    patched = json_patch(document, [
        {"op": "add", "path": "/a/-", "value": 3},
        {"op": "replace", "path": "/b/c", "value": "y"},
        {"op": "copy", "from": "/b", "path": "/e"},
        {"op": "move", "from": "/a/0", "path": "/f"},
        {"op": "remove", "path": "/b"},
        {"op": "test", "path": "/f", "value": 1},
        {"op": "add", "path": "/g~1h", "value": True},
    ])  # fmt: skip
    assert patched == {"a": [2, 3], "e": {"c": "y"}, "f": 1, "g/h": True}
    assert document == {"a": [1, 2], "b": {"c": "x"}}  # the input untouched
    for bad, why in (
        ([{"op": "remove", "path": "/nope"}], "does not exist"),
        ([{"op": "test", "path": "/a/0", "value": 9}], "failed"),
        ([{"op": "add", "path": "/a/7", "value": 0}], "out of range"),
        ([{"op": "frob", "path": "/a"}], "unknown JSON patch operation"),
        ({"op": "add"}, "a list of operations"),
    ):
        with pytest.raises(PatchError, match=why):
            json_patch(document, bad)


def test_a_patch_that_does_not_apply_is_one_line_of_422(api: ApiServer) -> None:
    api.put_pod("p")
    with httpx.Client(base_url=api.url) as http:
        reply = http.patch(
            "/api/v1/namespaces/default/pods/p",
            json=[{"op": "remove", "path": "/metadata/nothing"}],
            headers={"Content-Type": "application/json-patch+json"},
        )
        assert reply.status_code == 422
        assert (
            reply.json()["message"]
            == "the patch does not apply: path '/metadata/nothing' does not exist"
        )
        apply = http.patch("/api/v1/namespaces/default/pods/p", content=b"{}",
                           headers={"Content-Type": "application/apply-patch+yaml"})  # fmt: skip
        assert apply.status_code == 422 and "fieldManager" in apply.json()["message"]
        wrong = http.patch("/api/v1/namespaces/default/pods/p", json={"spec": {"nodeName": 3}},
                           headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
        assert wrong.status_code == 422 and "spec.nodeName" in wrong.json()["message"]
