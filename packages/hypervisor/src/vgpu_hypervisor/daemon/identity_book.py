"""A book the daemon keeps of some pods, in a file of its own folder (private_file.py): for each
pod, the identity of the region file the entry belongs to and what it holds of it. A pod made
again under the name gets another file, whose identity the entry does not match; the book of
the freezes (held_freezes.py) and the one of the pods deleted while their workers ran
(deleted_pods.py) are such books.

The file: ``[{"namespace", "name", "region": [st_dev, st_ino], ...}]``, each subclass's fields
after those. Not thread-safe: the pod store calls it under its lock."""

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from vgpu_hypervisor.daemon.private_file import PrivateFile, pod_entries

log = logging.getLogger(__name__)

Identity = tuple[int, int]  # (st_dev, st_ino) of the region file
Key = tuple[str, str]  # (namespace, name)
Value = TypeVar("Value")


class IdentityBook(Generic[Value]):
    FILE: ClassVar[str]

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._file = PrivateFile(folder, self.FILE)
        self._held: dict[Key, tuple[Identity, Value]] = {}
        if folder.is_dir():
            self._held = self._decode(self._file.load())

    def _found(self, key: Key, identity: Identity) -> Value | None:
        """What the book holds of the pod's region file ``identity``; None where nothing."""
        known = self._held.get(key)
        return known[1] if known is not None and known[0] == identity else None

    def _put(self, key: Key, identity: Identity, value: Value) -> None:
        if self._held.get(key) != (identity, value):
            self._held[key] = (identity, value)
            self._save()

    def forget(self, key: Key) -> None:
        if self._held.pop(key, None) is not None:
            self._save()

    def keep_only(self, present: Iterable[Key]) -> None:
        """Forget the pods gone (the caller names every pod it found)."""
        gone = set(self._held) - set(present)
        for key in gone:
            del self._held[key]
        if gone:
            self._save()

    def _fields(self, value: Value) -> Mapping[str, Any]:
        """An entry's fields past its pod and region, as written."""
        raise NotImplementedError

    def _value(self, entry: Mapping[str, Any]) -> Value:
        """An entry's value as read; TypeError, KeyError or ValueError for a bad one."""
        raise NotImplementedError

    def _save(self) -> None:
        self._file.save(
            [
                {"namespace": ns, "name": name, "region": list(identity), **self._fields(value)}
                for (ns, name), (identity, value) in sorted(self._held.items())
            ]
        )

    def _decode(self, document: Any) -> dict[Key, tuple[Identity, Value]]:
        """The entries of a file; none from one that is not a list of such entries (said)."""
        if document is None:
            return {}
        try:
            return {
                key: (identity, self._value(entry))
                for key, identity, entry in pod_entries(document)
            }
        except (TypeError, KeyError, ValueError) as error:
            log.warning("%s: cannot read: %s; starting afresh", self._file.path, error)
            return {}
