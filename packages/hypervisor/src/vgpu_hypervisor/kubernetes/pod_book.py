"""What the pod source made and wrote, kept where only the daemon writes: ``{base}/.kubernetes``.

An earlier version kept the pod's UID in a ``kubernetes-pod`` file inside the pod's folder,
which the pod's tenant can write: as root, the pod source wrote and read it following links,
so a symbolic link there made it overwrite any file (another pod's region), and a FIFO hung it.
A pod folder now holds nothing the daemon writes or reads but the region, which is opened
without following links and without blocking (region_file.c). That old file is never read or
followed: :func:`forget_old_marker` unlinks it relative to the pod folder.

The book's folder is made 0700 by the daemon and checked at every open to be the daemon's own
and closed to others (a folder someone else made there is refused); Allocate never mounts it
(a container gets its pod's folder, ``.devices`` and ``.node``). Its one file, ``pods.json``,
holds per pod the pod source made a region for: the pod's UID, the region file's identity,
each GPU's ceilings that are not the resources' (an admin's change through the API, or the
limits an annotations-only pod started with), the limits the pod source last wrote (a
difference is a change made since through the API), and whether the admin owns the pod's
class or a GPU's burst. It lives beside the regions (a tmpfs under /run by default), so it
lasts as long as they do. It is small (one entry per pod of the node) and rewritten whole,
through a new file renamed over the old.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from vgpu_common.limits import HUNDREDTHS_PER_PERCENT

from vgpu_hypervisor.daemon.private_file import PrivateFile, PrivateFolderError
from vgpu_hypervisor.kubernetes.resolver import Ceiling, GpuCeiling

log = logging.getLogger("vgpu_hypervisor.kubernetes")
FOLDER: Final = ".kubernetes"
FILE: Final = "pods.json"
OLD_MARKER: Final = "kubernetes-pod"  # where versions before this one kept a pod's UID
_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class BookError(Exception):
    """The book's folder is not the daemon's own; one line."""


@dataclass(frozen=True)
class Written:
    """A GPU's limits as its region held them after the pod source wrote (region units:
    bytes, hundredths of a percent; 0 = none)."""

    memory: int
    compute: int
    soft: int


@dataclass(frozen=True)
class Entry:
    """One pod the pod source made a region for."""

    uid: str
    region: tuple[int, int]  # (st_dev, st_ino) of the region file it wrote
    ceilings: Mapping[str, GpuCeiling] = field(default_factory=dict)  # by GPU UUID
    written: Mapping[str, Written] = field(default_factory=dict)
    qos: int | None = None  # the class it wrote last; None: the admin set the class
    admin_burst: frozenset[str] = frozenset()  # GPUs whose burst the admin set


class PodBook:
    """The entries by (namespace, name), in memory and in ``{base}/.kubernetes/pods.json``.
    Not thread-safe: the pod source changes it under its own lock."""

    def __init__(self, base: Path) -> None:
        self._file = PrivateFile(base / FOLDER, FILE)
        self.folder = self._file.folder
        try:
            self._file.check()  # BookError now, not at the first pod
        except PrivateFolderError as error:
            raise BookError(str(error)) from None
        self._entries = self._load()

    def get(self, namespace: str, name: str) -> Entry | None:
        return self._entries.get((namespace, name))

    def pods(self) -> list[tuple[str, str]]:
        return list(self._entries)

    def put(self, namespace: str, name: str, entry: Entry) -> None:
        if self._entries.get((namespace, name)) != entry:
            self._entries[(namespace, name)] = entry
            self._file.save(_encode(self._entries))

    def remove(self, namespace: str, name: str) -> None:
        if self._entries.pop((namespace, name), None) is not None:
            self._file.save(_encode(self._entries))

    def _load(self) -> dict[tuple[str, str], Entry]:
        document = self._file.load()
        if document is None:
            return {}
        try:
            return _decode(document)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("%s: cannot read: %s; starting afresh", self._file.path, error)
            return {}


def forget_old_marker(pod_folder: Path) -> None:
    """Remove the ``kubernetes-pod`` file an earlier version left in a pod's folder, unread.

    The tenant may have replaced it with anything: the folder is opened as itself (not
    through a link; a FIFO is no folder and does not block) and the name unlinked relative to
    it, which removes a link, never its target."""
    try:
        folder = os.open(pod_folder, _DIRECTORY)
    except OSError:
        return
    try:
        os.unlink(OLD_MARKER, dir_fd=folder)
    except OSError:
        pass  # none (the usual case), or a folder of that name: nothing of ours
    finally:
        os.close(folder)


# pods.json


def _encode(entries: Mapping[tuple[str, str], Entry]) -> dict[str, Any]:
    pods = []
    for (namespace, name), entry in sorted(entries.items()):
        gpus: dict[str, Any] = {}
        for uuid in sorted({*entry.ceilings, *entry.written}):
            ceiling = entry.ceilings.get(uuid, GpuCeiling())
            written = entry.written.get(uuid)
            gpus[uuid] = {
                "memory": _ceiling(ceiling.memory),
                "compute": _ceiling(ceiling.compute, HUNDREDTHS_PER_PERCENT),
                "written": None if written is None else [written.memory, written.compute,
                                                         written.soft],
                "admin_burst": uuid in entry.admin_burst,
            }  # fmt: skip
        pods.append({"namespace": namespace, "name": name, "uid": entry.uid,
                     "region": list(entry.region), "qos": entry.qos, "gpus": gpus})  # fmt: skip
    return {"version": 1, "pods": pods}


# A ceiling in the file: [bytes or percent (null: none), what set it]. Compute is written in
# percent, the unit people read (hundredths in the daemon).


def _ceiling(ceiling: Ceiling | None, scale: int = 1) -> list[Any] | None:
    if ceiling is None:
        return None
    value = ceiling.value if ceiling.value is None or scale == 1 else ceiling.value / scale
    return [value, ceiling.source]


def _decode(document: Any) -> dict[tuple[str, str], Entry]:
    if document.get("version") != 1:
        raise ValueError(f"version {document.get('version')!r}, this daemon reads version 1")
    entries = {}
    for pod in document["pods"]:
        ceilings, written, admin_burst = {}, {}, set()
        for uuid, gpu in pod["gpus"].items():
            ceilings[str(uuid)] = GpuCeiling(
                _read_ceiling(gpu["memory"]),
                _read_ceiling(gpu["compute"], HUNDREDTHS_PER_PERCENT),
            )
            if gpu["written"] is not None:
                memory, compute, soft = (int(value) for value in gpu["written"])
                written[str(uuid)] = Written(memory, compute, soft)
            if gpu["admin_burst"] is True:
                admin_burst.add(str(uuid))
        device, inode = (int(value) for value in pod["region"])
        qos = pod["qos"]
        entries[(str(pod["namespace"]), str(pod["name"]))] = Entry(
            uid=str(pod["uid"]),
            region=(device, inode),
            ceilings=ceilings,
            written=written,
            qos=None if qos is None else int(qos),
            admin_burst=frozenset(admin_burst),
        )
    return entries


def _read_ceiling(value: Any, scale: int = 1) -> Ceiling | None:
    if value is None:
        return None
    limit, source = value
    return Ceiling(None if limit is None else round(float(limit) * scale), str(source))
