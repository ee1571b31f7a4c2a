"""The pods the daemon deleted while their workers still charged their region file, by the
identity of that file: kept across its restarts in ``{base}/.daemon/deleted.json``
(private_file.py).

A deleted pod's file stays, marked deleted, until its last worker exits; the mark is a flag its
own processes can write. The daemon sets again a mark they clear. Before, it remembered these
pods in memory alone: a tenant that cleared the mark while no daemon ran (a restart, an upgrade)
had its pod, with the limits and class it wrote meanwhile, adopted as a new pod's by the next
daemon."""

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from vgpu_hypervisor.daemon.private_file import PrivateFile, pod_entries

log = logging.getLogger(__name__)

DELETED_FILE: Final = "deleted.json"

Identity = tuple[int, int]  # (st_dev, st_ino) of the region file
Key = tuple[str, str]  # (namespace, name)


@dataclass
class DeletedPods:
    """Not thread-safe: the pod store calls it under its lock."""

    folder: Path
    _held: dict[Key, Identity] = field(default_factory=dict)
    _file: PrivateFile | None = None

    def __post_init__(self) -> None:
        self._file = PrivateFile(self.folder, DELETED_FILE)
        if self.folder.is_dir():
            self._held = _decode(self._file.load(), self._file.path)

    def deleted(self, key: Key, identity: Identity) -> bool:
        """Whether the daemon deleted the pod whose region file is ``identity``."""
        return self._held.get(key) == identity

    def hold(self, key: Key, identity: Identity) -> None:
        if self._held.get(key) != identity:
            self._held[key] = identity
            self._save()

    def forget(self, key: Key) -> None:
        if self._held.pop(key, None) is not None:
            self._save()

    def keep_only(self, present: Iterable[Key]) -> None:
        """Forget the pods whose files are gone (the caller names every pod file it found,
        those marked deleted included)."""
        gone = set(self._held) - set(present)
        for key in gone:
            del self._held[key]
        if gone:
            self._save()

    def _save(self) -> None:
        if self._file is not None:
            self._file.save(
                [
                    {"namespace": ns, "name": name, "region": list(identity)}
                    for (ns, name), identity in sorted(self._held.items())
                ]
            )


def _decode(document: Any, path: Path) -> dict[Key, Identity]:
    """The pods a file holds; none from one that is not a list of such entries (said)."""
    if document is None:
        return {}
    try:
        return {key: identity for key, identity, _ in pod_entries(document)}
    except (TypeError, KeyError, ValueError) as error:
        log.warning("%s: cannot read: %s; starting afresh", path, error)
        return {}
