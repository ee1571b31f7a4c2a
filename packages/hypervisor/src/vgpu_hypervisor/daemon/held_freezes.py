"""The freezes the daemon holds, by pod: the GPUs each one holds (None: every GPU of the pod),
with the identity of the region file it was made on.

A freeze is a flag and a deadline in the pod's region, which the pod's own processes can write:
the daemon renews the deadline at every pass and makes again a freeze they cleared or narrowed.
What it holds is kept across its restarts in ``{base}/.daemon/freezes.json`` (private_file.py).
Before, it was held in memory alone: a process of the pod that cleared the flag while no daemon
ran (a restart, an upgrade) ran on after the next daemon started, read as not frozen, until an
admin froze it again. A freeze that ran out while no daemon renewed it (10 s) is made again
too: it ends at a resume, not when the daemon stops."""

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from vgpu_hypervisor.daemon.private_file import PrivateFile, pod_entries

log = logging.getLogger(__name__)

FREEZES_FILE: Final = "freezes.json"

Identity = tuple[int, int]  # (st_dev, st_ino) of the region file
Key = tuple[str, str]  # (namespace, name)
Gpus = frozenset[str | None]  # the frozen GPUs' UUIDs as the admin named them; None: all


@dataclass
class HeldFreezes:
    """Not thread-safe: the pod store calls it under its lock."""

    folder: Path
    _held: dict[Key, tuple[Identity, Gpus]] = field(default_factory=dict)
    _file: PrivateFile | None = None

    def __post_init__(self) -> None:
        self._file = PrivateFile(self.folder, FREEZES_FILE)
        if self.folder.is_dir():
            self._held = _decode(self._file.load(), self._file.path)

    def gpus(self, key: Key, identity: Identity) -> Gpus | None:
        """The GPUs of the pod's freeze on region file ``identity``; None when it has none."""
        known = self._held.get(key)
        return known[1] if known is not None and known[0] == identity else None

    def hold(self, key: Key, identity: Identity, gpus: Iterable[str | None]) -> None:
        value = (identity, frozenset(gpus))
        if self._held.get(key) != value:
            self._held[key] = value
            self._save()

    def forget(self, key: Key) -> None:
        if self._held.pop(key, None) is not None:
            self._save()

    def keep_only(self, present: Iterable[Key]) -> None:
        """Forget the freezes of pods gone (the caller names every pod it found)."""
        gone = set(self._held) - set(present)
        for key in gone:
            del self._held[key]
        if gone:
            self._save()

    def _save(self) -> None:
        if self._file is not None:
            self._file.save(_encode(self._held))


# {base}/.daemon/freezes.json: [{"namespace", "name", "region": [st_dev, st_ino],
#                                "gpus": [uuid or null, ...]}]


def _encode(held: Mapping[Key, tuple[Identity, Gpus]]) -> list[Any]:
    return [
        {
            "namespace": ns,
            "name": name,
            "region": list(identity),
            "gpus": sorted(gpus, key=lambda gpu: (gpu is not None, gpu or "")),
        }
        for (ns, name), (identity, gpus) in sorted(held.items())
    ]


def _decode(document: Any, path: Path) -> dict[Key, tuple[Identity, Gpus]]:
    """The freezes a file holds; none from one that is not a list of such entries (said)."""
    held: dict[Key, tuple[Identity, Gpus]] = {}
    if document is None:
        return held
    try:
        for key, identity, entry in pod_entries(document):
            gpus = entry["gpus"]
            if not isinstance(gpus, list) or not gpus:
                raise TypeError("a freeze of no GPUs")
            if not all(gpu is None or isinstance(gpu, str) for gpu in gpus):
                raise TypeError("a GPU that is not a UUID or null")
            held[key] = (identity, frozenset(gpus))
    except (TypeError, KeyError, ValueError) as error:
        log.warning("%s: cannot read: %s; starting afresh", path, error)
        return {}
    return held
