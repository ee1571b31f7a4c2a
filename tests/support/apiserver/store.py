"""The objects, their versions and their history: what etcd and the registry are upstream.

Every change takes the next resourceVersion (one counter for all kinds, as etcd's revision)
and is kept in a history that watches read from; ``compact`` forgets it (a watch from before
then gets 410 Gone). Deletion is graceful where the kind says so: the object gets its
``deletionTimestamp`` and goes when its grace is over (the stand-in's kubelet is quicker:
``stop_pods_s``) or when it is deleted again with grace 0; finalizers hold any object until
they are removed. A namespace that is deleted deletes its objects, then goes.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.apiserver.errors import ApiError, not_found
from tests.support.apiserver.kinds import Invalid, Kind
from tests.support.apiserver.selectors import Selector

Object = dict[str, Any]
# Records in the new object (its managedFields) what a client's write changed: the kind, the
# object before (None: created), the object after, and who wrote it and where (its manager,
# the subresource).
Track = Callable[[Kind, Object | None, Object, "Writer"], None]
Key = tuple[str, str, str, str]  # group, plural, namespace ("" if cluster-scoped), name

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what generateName suffixes are made of


_SERVER_SET = ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
               "deletionGracePeriodSeconds", "resourceVersion")  # fmt: skip


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Writer:
    """A client's write: its field manager, and the subresource it wrote (None: the object)."""

    manager: str
    subresource: str | None = None


@dataclass(frozen=True)
class Change:
    version: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: Kind
    obj: Object
    # The object before a change (None for ADDED): a watch tells who entered or left, a
    # list's next page sees the objects as they were.
    old: Object | None


class Store:
    def __init__(
        self,
        validate: Callable[[Object, bool], list[str]],
        *,
        track: Track = lambda kind, old, new, writer: None,
        decode: Callable[[Kind, Any], None] = lambda kind, obj: None,
        stop_pods_s: float | None = 0.5,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.validate = validate
        self.track = track
        self.decode = decode  # raises 400 for what upstream could not decode
        self.stop_pods_s = stop_pods_s
        self.clock = clock
        self.version = 1
        self.compacted = 0  # watches from a version before this get 410 Gone
        self.generation = 0  # bumped to cut every open watch
        self.changed = threading.Condition()
        self._objects: dict[Key, tuple[Kind, Object]] = {}
        self.history: list[Change] = []
        self._uids = itertools.count(1)
        self._created = datetime.min.replace(tzinfo=UTC)
        self._random = random.Random(0)

    # Reading

    @staticmethod
    def key(kind: Kind, namespace: str | None, name: str) -> Key:
        return (kind.group, kind.plural, namespace or "", name)

    def get(self, kind: Kind, namespace: str | None, name: str) -> Object:
        with self.changed:
            found = self._objects.get(self.key(kind, namespace, name))
            if found is None:
                raise not_found(kind.plural, name)
            return copy.deepcopy(found[1])

    def select(
        self, kind: Kind, namespace: str | None, selector: Selector, at: int | None = None
    ) -> tuple[list[Object], int]:
        """The objects the selector sees, now or as they were at version ``at`` (a list's
        next page shows the list's moment: 410 Expired once that history is compacted)."""
        with self.changed:
            objects = self._objects if at is None else self._as_of(at)
            items = [
                copy.deepcopy(obj)
                for (group, plural, ns, _), (_, obj) in objects.items()
                if (group, plural) == (kind.group, kind.plural)
                and (namespace is None or ns == namespace)
                and selector.matches(obj)
            ]
            return items, self.version if at is None else at

    def _as_of(self, version: int) -> dict[Key, tuple[Kind, Object]]:
        if version < self.compacted or version > self.version:
            raise ApiError(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter.",
            )
        objects = dict(self._objects)
        for change in reversed(self.history):
            if change.version <= version:
                break
            key = self.key(change.kind, change.obj["metadata"].get("namespace"),
                           change.obj["metadata"]["name"])  # fmt: skip
            if change.old is None:
                objects.pop(key, None)  # made after the version
            else:
                objects[key] = (change.kind, change.old)  # as it was before the change
        return objects

    # Changing

    def _record(self, type_: str, kind: Kind, obj: Object, old: Object | None = None) -> None:
        self.history.append(Change(self.version, type_, kind, copy.deepcopy(obj), old))
        self.changed.notify_all()

    def _bump(self, obj: Object) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _check_namespace(self, namespace: str) -> None:
        found = self._objects.get(("", "namespaces", "", namespace))
        if found is None:
            raise not_found("namespaces", namespace)
        if found[1]["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace "
                f"{namespace} because it is being terminated",
            )

    def create(
        self,
        kind: Kind,
        namespace: str | None,
        body: Object,
        *,
        strict: bool,
        dry_run: bool,
        writer: Writer | None = None,
    ) -> tuple[Object, list[str]]:
        self.decode(kind, body)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata is not an object")
        if kind.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does "
                    "not match the namespace sent on the request",
                )
            meta["namespace"] = namespace
        with self.changed:
            if kind.namespaced:
                assert namespace is not None
                self._check_namespace(namespace)
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise ApiError(
                        422,
                        "Invalid",
                        f"{kind.kind} is invalid: metadata.name: "
                        "Required value: name or generateName is required",
                    )
                suffix = "".join(self._random.choice(_NAME_CHARS) for _ in range(5))
                meta["name"] = prefix + suffix
            name = meta["name"]
            if self.key(kind, namespace, name) in self._objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{kind.plural} "{name}" already exists',
                    {"name": name, "kind": kind.plural},
                )
            for server_set in (
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                meta.pop(server_set, None)
            obj["kind"], obj["apiVersion"] = kind.kind, kind.group_version
            meta["uid"] = f"00000000-0000-4000-8000-{next(self._uids):012d}"
            meta["creationTimestamp"] = self._creation()
            meta.setdefault("generation", 1)
            if kind.defaults is not None:
                kind.defaults(obj)
            warnings = self.validate(obj, strict)
            if writer is not None:
                self.track(kind, None, obj, writer)
            if dry_run:
                return obj, warnings
            self._bump(obj)
            self._objects[self.key(kind, namespace, name)] = (kind, obj)
            self._record("ADDED", kind, obj)
            return copy.deepcopy(obj), warnings

    def _creation(self) -> str:
        """Now, or a second after the last creation: creation order shows at the API's
        resolution of one second (pods pending on a node are taken oldest first)."""
        self._created = max(
            self.clock().replace(microsecond=0), self._created + timedelta(seconds=1)
        )
        return timestamp(self._created)

    def put(self, kind: Kind, namespace: str | None, body: Object) -> Object:
        """Create the object, or write it over the one there (keeping its uid and creation):
        checked against the schema, not against what an update may change."""
        name = body["metadata"]["name"]
        with self.changed:
            found = self._objects.get(self.key(kind, namespace, name))
            if found is None:
                return self.create(kind, namespace, body, strict=True, dry_run=False)[0]
            old = found[1]
            new = copy.deepcopy(body)
            new["kind"], new["apiVersion"] = kind.kind, kind.group_version
            for kept in ("uid", "creationTimestamp", "generation", "namespace"):
                if kept in old["metadata"]:
                    new["metadata"][kept] = old["metadata"][kept]
            if kind.defaults is not None:
                kind.defaults(new)
            self.validate(new, True)
            self._bump(new)
            self._objects[self.key(kind, namespace, name)] = (kind, new)
            self._record("MODIFIED", kind, new, old)
            return copy.deepcopy(new)

    def update(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        change: Callable[[Object], Object],
        *,
        subresource: str | None,
        strict: bool,
        dry_run: bool,
        writer: Writer | None = None,
    ) -> tuple[Object, list[str]]:
        """Replace an object by ``change(current)``: a PUT's body, or the patched object. A
        resourceVersion in it that is not the current one is a conflict. A ``writer``'s
        changes are recorded in the object's managedFields (an apply records its own)."""
        with self.changed:
            found = self._objects.get(self.key(kind, namespace, name))
            if found is None:
                raise not_found(kind.plural, name)
            old = found[1]
            changed = change(copy.deepcopy(old))
            try:
                self.decode(kind, changed)
            except ApiError as error:  # what a patch made: upstream says so as the patch's fault
                raise ApiError(
                    422, "Invalid", f'{kind.kind} "{name}" is invalid: patch: {error.message}'
                ) from None
            new = self._replacement(kind, old, changed, subresource)
            warnings = self.validate(new, strict)
            if writer is not None:
                self.track(kind, old, new, writer)
            if subresource is None and kind.check_update is not None:
                try:
                    kind.check_update(old, new)
                except Invalid as error:
                    raise ApiError(
                        422, "Invalid", f'{kind.kind} "{name}" is invalid: {error}'
                    ) from None
            if new.get("spec") != old.get("spec"):
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            if dry_run or new == old:
                return new, warnings  # an update that changes nothing takes no version
            self._bump(new)
            self._objects[self.key(kind, namespace, name)] = (kind, new)
            self._record("MODIFIED", kind, new, old)
            meta = new["metadata"]
            stopped = meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") == 0
            if stopped and not meta.get("finalizers"):
                self._remove(kind, namespace, name)
            return copy.deepcopy(new), warnings

    @staticmethod
    def _replacement(kind: Kind, old: Object, new: Any, subresource: str | None) -> Object:
        """What an update writes: the new object with what only the server sets kept."""
        name = old["metadata"]["name"]
        if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the object has no metadata")
        if new["metadata"].get("name", name) != name:
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object "
                f"({new['metadata'].get('name')}) does not match the name on the URL ({name})",
            )
        asked = new["metadata"].get("resourceVersion")
        if asked and asked != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {kind.plural} "
                f'"{name}": the object has been modified; please apply your changes to '
                "the latest version and try again",
            )
        if subresource == "status":
            fields = new["metadata"].get("managedFields", old["metadata"].get("managedFields"))
            new = {**copy.deepcopy(old), "status": new.get("status", {})}
            if fields is not None:  # an apply of the status records its manager
                new["metadata"]["managedFields"] = fields
        elif kind.status:
            new["status"] = copy.deepcopy(old.get("status", {}))
        new["kind"], new["apiVersion"] = kind.kind, kind.group_version
        for kept in _SERVER_SET:
            if kept in old["metadata"]:
                new["metadata"][kept] = old["metadata"][kept]
            else:
                new["metadata"].pop(kept, None)
        if kind.defaults is not None:
            kind.defaults(new)  # as decoding does upstream: 1 and "1" are one quantity
        replacement: Object = new
        return replacement

    def delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        *,
        grace: int | None = None,
        uid: str | None = None,
        version: str | None = None,
        dry_run: bool = False,
    ) -> Object:
        with self.changed:
            found = self._objects.get(self.key(kind, namespace, name))
            if found is None:
                raise not_found(kind.plural, name)
            obj = found[1]
            meta = obj["metadata"]
            if (uid and uid != meta["uid"]) or (version and version != meta["resourceVersion"]):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{name}": '
                    "the precondition (UID or ResourceVersion) does not match",
                )
            if dry_run:
                return copy.deepcopy(obj)
            wait = kind.grace(obj, grace) if kind.grace is not None else None
            if kind.kind == "Namespace" and kind.group == "":
                return self._delete_namespace(obj)
            if wait is None and not meta.get("finalizers"):
                return self._remove(kind, namespace, name)
            if meta.get("deletionTimestamp") and (wait or 0) >= meta["deletionGracePeriodSeconds"]:
                return copy.deepcopy(obj)  # already going, as soon or sooner
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = timestamp(
                self.clock() + timedelta(seconds=wait or 0)
            )
            # 0 once no node waits on it (the kubelet's last delete): finalizers alone hold it.
            new["metadata"]["deletionGracePeriodSeconds"] = wait or 0
            self._bump(new)
            self._objects[self.key(kind, namespace, name)] = (kind, new)
            self._record("MODIFIED", kind, new, obj)
            if wait is not None and self.stop_pods_s is not None:
                self._later(min(wait, self.stop_pods_s), kind, namespace, name, meta["uid"])
            return copy.deepcopy(new)

    def _later(self, delay: float, kind: Kind, namespace: str | None, name: str, uid: str) -> None:
        """The node stops the object after ``delay``: its delete with grace 0."""

        def finish() -> None:
            with self.changed, contextlib.suppress(ApiError):
                self.delete(kind, namespace, name, grace=0, uid=uid)

        timer = threading.Timer(delay, finish)
        timer.daemon = True
        timer.start()

    def _remove(self, kind: Kind, namespace: str | None, name: str) -> Object:
        _, obj = self._objects.pop(self.key(kind, namespace, name))
        gone = copy.deepcopy(obj)
        self._bump(gone)
        self._record("DELETED", kind, gone, obj)
        if kind.namespaced and namespace:
            self._finish_namespace(namespace)
        return gone

    def _delete_namespace(self, namespace: Object) -> Object:
        name = namespace["metadata"]["name"]
        if not namespace["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(namespace)
            new["metadata"]["deletionTimestamp"] = timestamp(self.clock())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["status"]["phase"] = "Terminating"
            self._bump(new)
            kind = self._objects[("", "namespaces", "", name)][0]
            self._objects[("", "namespaces", "", name)] = (kind, new)
            self._record("MODIFIED", kind, new, namespace)
            for (_, _, ns, member), (member_kind, _) in list(self._objects.items()):
                if ns == name and member_kind.namespaced:
                    self.delete(member_kind, ns, member)
        self._finish_namespace(name)
        found = self._objects.get(("", "namespaces", "", name))
        return copy.deepcopy(found[1] if found is not None else namespace)

    def _finish_namespace(self, name: str) -> None:
        found = self._objects.get(("", "namespaces", "", name))
        if found is None or not found[1]["metadata"].get("deletionTimestamp"):
            return
        if not any(ns == name for (_, _, ns, _) in self._objects):
            self._remove(found[0], None, name)

    # History

    def compact(self) -> None:
        """Forget the history: a watch from a version handed out so far gets 410 Gone."""
        with self.changed:
            self.compacted = self.version + 1
            self.history.clear()
            self.cut()

    def cut(self) -> None:
        """End every open watch."""
        with self.changed:
            self.generation += 1
            self.changed.notify_all()

    def changes(
        self,
        kind: Kind,
        namespace: str | None,
        selector: Selector,
        since: int | None,
        *,
        deadline: float,
        bookmark_s: float | None,
        initial_end_bookmark: bool = False,
        gone: Callable[[], bool] = lambda: False,
    ) -> Iterator[Object]:
        """A watch's events: with ``since`` None the objects there are now (ADDED), then every
        change after ``since`` that the selector sees, until ``deadline`` (monotonic) or
        until the watches are cut. Raises 410 Gone for a version compacted away, at the
        first event."""
        with self.changed:
            generation = self.generation
            if since is not None and 0 < since < self.compacted:
                raise ApiError(
                    410, "Expired", f"too old resource version: {since} ({self.compacted})"
                )
            if since is None or since == 0:
                items, sent = self.select(kind, namespace, selector)
                pending: list[Object] = [{"type": "ADDED", "object": o} for o in items]
            else:
                sent, pending = since, []
        if initial_end_bookmark:
            pending.append(self._bookmark(kind, sent, initial_end=True))
        yield from pending
        every = math.inf if bookmark_s is None else bookmark_s
        bookmark_at = time.monotonic() + every
        while True:
            with self.changed:
                if not self._wait(generation, sent, min(deadline, bookmark_at), gone):
                    return
                if time.monotonic() >= deadline:
                    return
                changes = [c for c in self.history if c.version > sent]
                latest = self.version
            events = []
            for change in changes:
                sent = change.version
                event = self._event(change, kind, namespace, selector)
                if event is not None:
                    events.append(event)
            if not events and time.monotonic() >= bookmark_at:
                sent = max(sent, latest)
                events.append(self._bookmark(kind, sent))
            bookmark_at = time.monotonic() + every
            yield from events

    def _wait(self, generation: int, sent: int, until: float, gone: Callable[[], bool]) -> bool:
        """Wait (holding the lock) for a change after ``sent`` or for ``until``; False when
        the watches were cut or the client went away."""
        while generation == self.generation and time.monotonic() < until:
            if self.history and self.history[-1].version > sent:
                return True
            self.changed.wait(timeout=max(0.0, min(until - time.monotonic(), 1.0)))
            if gone():
                return False
        return generation == self.generation

    @staticmethod
    def _bookmark(kind: Kind, version: int, *, initial_end: bool = False) -> Object:
        meta: Object = {"resourceVersion": str(version)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {
            "type": "BOOKMARK",
            "object": {"kind": kind.kind, "apiVersion": kind.group_version, "metadata": meta},
        }

    @staticmethod
    def _event(
        change: Change, kind: Kind, namespace: str | None, selector: Selector
    ) -> Object | None:
        if (change.kind.group, change.kind.plural) != (kind.group, kind.plural):
            return None
        if namespace is not None and change.obj["metadata"].get("namespace") != namespace:
            return None
        now = selector.matches(change.obj)
        before = change.old is not None and selector.matches(change.old)
        if change.type == "MODIFIED" and now != before:
            # Entering or leaving the selection reads as being added or deleted.
            return {"type": "ADDED" if now else "DELETED", "object": change.obj}
        return {"type": change.type, "object": change.obj} if now else None
