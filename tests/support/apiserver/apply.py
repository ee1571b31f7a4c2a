"""Server-side apply (``application/apply-patch+yaml``): the applied configuration merged into
the object, each manager's fields recorded in ``metadata.managedFields``.

As upstream's structured merge: objects and maps merge key by key (but those the schema makes
``x-kubernetes-map-type: atomic``, replaced whole); a list merges item by item
where the published schema makes it a map (``x-kubernetes-list-type: map``, by its
``x-kubernetes-list-map-keys``) or a set (``set``), and is replaced whole otherwise (``atomic``).
Each apply records the fields its configuration sets (``FieldsV1``: ``f:`` a field, ``k:`` a
list item by its keys, ``v:`` a set's value, ``.`` the node itself); a field the same manager
applied before and applies no more is removed, unless another manager owns it too. Setting a
field that another manager owns to another value is a 409 conflict naming the field and its
manager, unless the request says ``force=true``, which takes the field over.

Writes by other verbs are recorded as upstream records them: the fields a create, update or
patch changed go to that request's manager (its ``fieldManager``, else the client's name from
its User-Agent), with operation ``Update``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from tests.support.apiserver.errors import ApiError

Object = dict[str, Any]
Schema = dict[str, Any] | None
Resolve = Callable[[dict[str, Any]], dict[str, Any]]
Path = tuple[str, ...]  # FieldsV1 elements from the root: ("f:spec", 'k:{"name":"a"}', ...)

_SELF = "."
# What the server owns: never a manager's field.
_SERVER = {("f:apiVersion",), ("f:kind",)} | {
    ("f:metadata", f"f:{n}")
    for n in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "generation",
              "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")
}  # fmt: skip


def _field(schema: Schema, resolve: Resolve, name: str) -> Schema:
    if schema is None:
        return None
    node = resolve(schema)
    properties = node.get("properties")
    if isinstance(properties, dict) and name in properties:
        return resolve(properties[name])
    extra = node.get("additionalProperties")
    return resolve(extra) if isinstance(extra, dict) else None


def _atomic(schema: Schema, resolve: Resolve) -> bool:
    """An object or map replaced and owned whole (``x-kubernetes-map-type: atomic``: a label
    selector, a node selector, an object reference)."""
    return schema is not None and resolve(schema).get("x-kubernetes-map-type") == "atomic"


def _is_map(schema: Schema, resolve: Resolve) -> bool:
    """A map of free keys (labels, data), whose node a manager owns with its entries."""
    if schema is None:
        return False
    node = resolve(schema)
    return "properties" not in node and isinstance(node.get("additionalProperties"), dict)


def _list(schema: Schema, resolve: Resolve) -> tuple[str, list[str], Schema]:
    """A list's type (map, set or atomic), its map keys and its items' schema."""
    node = resolve(schema) if schema is not None else {}
    kind = node.get("x-kubernetes-list-type", "atomic")
    keys = list(node.get("x-kubernetes-list-map-keys", []))
    if kind == "map" and not keys and node.get("x-kubernetes-patch-merge-key"):
        keys = [node["x-kubernetes-patch-merge-key"]]
    items = node.get("items")
    return kind, keys, resolve(items) if isinstance(items, dict) else None


def _item_key(item: Any, keys: list[str]) -> str:
    """A list item's element: its keys' values (those it has: upstream defaults the others,
    such as a port's protocol)."""
    if not isinstance(item, dict) or not any(k in item for k in keys):
        raise ApiError(
            422,
            "Invalid",
            f"an element of an associative list with keys {keys} omits them: {_compact(item)}",
        )
    values = {k: item[k] for k in keys if k in item}
    return "k:" + json.dumps(values, separators=(",", ":"), sort_keys=True)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# The fields of a document


def leaves(document: Any, schema: Schema, resolve: Resolve) -> dict[Path, Any]:
    """Every field the document sets, by its path, with its value (a list item, a map and an
    empty object are fields of their own)."""
    found: dict[Path, Any] = {}
    _walk(document, schema, resolve, (), found)
    for path in _SERVER:
        found.pop(path, None)
    return found


def _walk(value: Any, schema: Schema, resolve: Resolve, at: Path, found: dict[Path, Any]) -> None:
    if isinstance(value, dict) and value and not _atomic(schema, resolve):
        if at and _is_map(schema, resolve):
            found[(*at, _SELF)] = None
        for key, child in value.items():
            _walk(child, _field(schema, resolve, key), resolve, (*at, f"f:{key}"), found)
        return
    if isinstance(value, list):
        kind, keys, items = _list(schema, resolve)
        if kind == "map" and keys:
            for item in value:
                path = (*at, _item_key(item, keys))
                found[(*path, _SELF)] = None
                _walk(item, items, resolve, path, found)
            return
        if kind == "set":
            for item in value:
                found[(*at, "v:" + _compact(item))] = item
            return
    if _is_quantity(schema, resolve) and isinstance(value, int | float):
        value = str(value)  # 1 and "1" are one quantity (upstream compares them decoded)
    found[at] = value  # a scalar, an empty object, an atomic list


def _is_quantity(schema: Schema, resolve: Resolve) -> bool:
    """A quantity's node: a string or a number (an int-or-string is a string or an integer)."""
    choices = resolve(schema).get("oneOf", []) if schema is not None else []
    return any("number" in (c.get("type") or []) for c in choices)


def _tree(paths: set[Path]) -> Object:
    """Paths as FieldsV1."""
    tree: Object = {}
    for path in sorted(paths):
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    return tree


def _paths(tree: Any, at: Path = ()) -> set[Path]:
    """FieldsV1 as paths."""
    if not isinstance(tree, dict) or not tree:
        return {at} if at else set()
    found: set[Path] = set()
    for element, child in tree.items():
        found |= _paths(child, (*at, element))
    return found


def _shown(path: Path) -> str:
    """A path as upstream's conflicts name it: .spec.containers[name="a"].image."""
    text = ""
    for element in path:
        if element == _SELF:
            continue
        prefix, _, rest = element.partition(":")
        if prefix == "f":
            text += f".{rest}"
        elif prefix == "k":
            text += (
                "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(rest).items()) + "]"
            )
        else:
            text += f"[={rest}]"
    return text


# Merging


def merge(live: Any, config: Any, schema: Schema, resolve: Resolve) -> Any:
    """``config`` merged into ``live`` (a new document)."""
    if isinstance(config, dict) and isinstance(live, dict) and not _atomic(schema, resolve):
        result = copy.deepcopy(live)
        for key, value in config.items():
            result[key] = merge(live.get(key), value, _field(schema, resolve, key), resolve)
        return result
    if isinstance(config, list) and isinstance(live, list):
        kind, keys, items = _list(schema, resolve)
        if kind == "map" and keys:
            result_list = copy.deepcopy(live)
            at = {_item_key(item, keys): i for i, item in enumerate(result_list)}
            for item in config:
                key = _item_key(item, keys)
                if key in at:
                    result_list[at[key]] = merge(result_list[at[key]], item, items, resolve)
                else:
                    result_list.append(copy.deepcopy(item))
            return result_list
        if kind == "set":
            return copy.deepcopy(live) + [copy.deepcopy(v) for v in config if v not in live]
    return copy.deepcopy(config)


def _remove(document: Any, path: Path, schema: Schema, resolve: Resolve) -> None:
    """Take the field at ``path`` out of ``document`` (nothing where it is not there)."""
    if not path or path == (_SELF,):
        return
    element, rest = path[0], path[1:]
    prefix, _, name = element.partition(":")
    if prefix == "f" and isinstance(document, dict) and name in document:
        if not rest or rest == (_SELF,):
            del document[name]
        else:
            _remove(document[name], rest, _field(schema, resolve, name), resolve)
    elif prefix in ("k", "v") and isinstance(document, list):
        _, keys, items = _list(schema, resolve)
        for i, item in enumerate(document):
            mine = _item_key(item, keys) if prefix == "k" else "v:" + _compact(item)
            if mine == element:
                if not rest or rest == (_SELF,):
                    del document[i]
                else:
                    _remove(item, rest, items, resolve)
                return


def _entries(obj: Object) -> list[Object]:
    entries: list[Object] = obj.get("metadata", {}).get("managedFields") or []
    return entries


def _owned(entry: Object) -> set[Path]:
    return _paths(entry.get("fieldsV1", {}))


def _record(
    obj: Object,
    manager: str,
    operation: str,
    paths: set[Path],
    *,
    subresource: str | None,
    now: str,
    others_lose: set[Path],
) -> None:
    """Give ``paths`` to the manager's entry (replacing it for an apply, adding to it for an
    update; where it stood, else last); ``others_lose`` leave every other entry, and entries
    left empty go."""
    entries: list[Object | None] = []
    mine: Object | None = None
    for entry in _entries(obj):
        same = (entry.get("manager"), entry.get("operation"), entry.get("subresource")) == (
            manager,
            operation,
            subresource,
        )
        if same:
            mine = entry
            entries.append(None)  # its place
            continue
        kept = _owned(entry) - others_lose
        if kept:
            entries.append({**entry, "fieldsV1": _tree(kept)})
    if mine is None:
        entries.append(None)
    owned = paths if operation == "Apply" or mine is None else _owned(mine) | paths
    new: Object | None = None
    if owned:
        new = {
            "manager": manager,
            "operation": operation,
            "apiVersion": obj["apiVersion"],
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": _tree(owned),
        }
        if subresource:
            new["subresource"] = subresource
    obj["metadata"]["managedFields"] = [e if e is not None else new for e in entries]
    obj["metadata"]["managedFields"] = [e for e in obj["metadata"]["managedFields"] if e]
    if not obj["metadata"]["managedFields"]:
        del obj["metadata"]["managedFields"]


def apply(
    live: Object | None,
    config: Object,
    schema: Schema,
    resolve: Resolve,
    *,
    manager: str,
    force: bool,
    subresource: str | None,
    now: str,
) -> Object:
    """The object after ``manager`` applied ``config`` to ``live`` (None: it is created)."""
    applied = leaves(config, schema, resolve)
    if live is None:
        made = copy.deepcopy(config)
        made.setdefault("metadata", {})
        _record(made, manager, "Apply", set(applied), subresource=subresource, now=now,
                others_lose=set())  # fmt: skip
        return made
    current = leaves(live, schema, resolve)
    conflicts: list[tuple[Path, str]] = []
    for entry in _entries(live):
        if entry.get("manager") == manager:
            continue
        for path in _owned(entry) & set(applied):
            if path[-1] != _SELF and current.get(path) != applied[path]:
                conflicts.append((path, entry["manager"]))
    if conflicts and not force:
        raise _conflict(conflicts, live["apiVersion"])
    merged: Object = merge(live, config, schema, resolve)
    before = next(
        (
            _owned(e)
            for e in _entries(live)
            if (e.get("manager"), e.get("operation"), e.get("subresource"))
            == (manager, "Apply", subresource)
        ),
        set(),
    )
    others = set().union(*(_owned(e) for e in _entries(live) if e.get("manager") != manager))
    for path in sorted(before - set(applied) - others, key=len, reverse=True):
        _remove(merged, path, schema, resolve)
    taken = {p for p, _ in conflicts} if force else set()
    _record(merged, manager, "Apply", set(applied), subresource=subresource, now=now,
            others_lose=taken)  # fmt: skip
    if _timeless(merged) == _timeless(live):
        return copy.deepcopy(live)  # a no-op: not even the entry's time changes
    return merged


def _timeless(obj: Object) -> Object:
    bare = copy.deepcopy(obj)
    for entry in _entries(bare):
        entry.pop("time", None)
    return bare


def _conflict(conflicts: list[tuple[Path, str]], api_version: str) -> ApiError:
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f'conflict with "{manager}" using {api_version}',
            "field": _shown(path),
        }
        for path, manager in conflicts
    ]
    count = len(causes)
    lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
    message = f"Apply failed with {count} conflict{'s' if count > 1 else ''}: " + (
        f"{causes[0]['message']}: {causes[0]['field']}" if count == 1 else f"\n{lines}"
    )
    return ApiError(409, "Conflict", message, {"causes": causes})


def updated(
    old: Object | None,
    new: Object,
    schema: Schema,
    resolve: Resolve,
    *,
    manager: str,
    subresource: str | None,
    now: str,
) -> None:
    """Record in ``new`` the fields a create, update or patch by ``manager`` changed."""
    try:
        before = {} if old is None else leaves(old, schema, resolve)
        after = leaves(new, schema, resolve)
    except ApiError:
        return  # a list without its keys, which validation refuses
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    if old is not None:
        new["metadata"]["managedFields"] = copy.deepcopy(_entries(old)) or []
    if not changed:
        if not new["metadata"].get("managedFields"):
            new["metadata"].pop("managedFields", None)
        return
    _record(new, manager, "Update", changed, subresource=subresource, now=now,
            others_lose=changed)  # fmt: skip
