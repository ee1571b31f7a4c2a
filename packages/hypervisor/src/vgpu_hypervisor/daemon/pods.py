"""The node's pods: their region files under the base path.

The region files hold the pods. What the daemon holds them to, which their tenants could
rewrite there (limits, class and weight, freezes, deletions), it keeps in its own folder,
``{base}/.daemon`` (private_file.py), so that a restart loses none of it. A scan
finds every ``{base}/{namespace}/{pod}/shm``, the daemon's own and those a limiter created
alone (adopted as they are). A file that cannot be read is reported as that pod's error and
the scan goes on with the others.

A region is never recreated under live processes: creating a pod that exists is a conflict,
limits change in place (the limiter's seqlock), and deleting a pod whose workers live needs
``force``. A forced delete keeps the file, marked deleted (hidden from the pods listed), while
its workers live: they keep charging it, and a pod created again under the same name takes it
over with its usage, so old and new workers share the one limit. A scan removes it once they
are gone.

A frozen pod's launches wait in the limiter. The freeze holds for FREEZE_HOLD_S past the
daemon's last renewal (every pass renews the freezes of all frozen pods, those of an earlier
daemon included), so a pod is never left frozen for longer than that by a daemon that is gone.
"""

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from vgpu_common.limits import NO_LIMITS, GpuLimits, Qos, format_size, normalize_uuid
from vgpu_limiter import region as regions
from vgpu_limiter.region import (
    FLAG_DELETED,
    FLAG_FROZEN,
    DeviceInfo,
    DeviceLimits,
    ProcessInfo,
    Region,
    RegionError,
)

from vgpu_hypervisor.daemon.deleted_pods import DeletedPods
from vgpu_hypervisor.daemon.held_freezes import HeldFreezes
from vgpu_hypervisor.daemon.held_limits import HeldLimits
from vgpu_hypervisor.daemon.private_file import PrivateFile, pod_entries

log = logging.getLogger("vgpu_hypervisor")
POLICY_FOLDER: Final = ".daemon"  # the daemon's own, 0700 (private_file.py)
POLICY_FILE: Final = "policies.json"
FREEZE_HOLD_S: Final = 10.0  # a freeze not renewed for this long ends (the daemon is gone)
PodKey = tuple[str, str]  # (namespace, name)


class PodError(Exception):
    """A pod operation that cannot be done as asked (a bad name or limit); one line."""


class PodNotFound(PodError):
    """No such pod."""


class PodConflict(PodError):
    """The pod's state stands in the way: it exists, its workers live, its region is unusable."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """One pod as its region file read at one moment; ``error`` says why it could not be read
    (then ``devices`` and ``processes`` are empty)."""

    namespace: str
    name: str
    path: Path
    created_ns: int = 0
    devices: tuple[DeviceInfo, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    error: str | None = None
    frozen: bool = False
    frozen_gpus: tuple[str, ...] = ()  # the GPUs a freeze holds when it holds only some
    qos: int = Qos.MEDIUM
    weight: int = 0  # 0: from the qos

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass
class _Open:
    region: Region
    identity: tuple[int, int]  # (st_dev, st_ino) of the file mapped
    cut_back: bool = False  # it grew, was cut back and said so (once per file)


@dataclass
class PodStore:
    """The pods under ``base``. Thread-safe: API requests and the daemon's passes share it."""

    base: Path
    _open: dict[Path, _Open] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    # The limits an admin (the API) last wrote into each pod, by GPU: a region's words differing
    # from what the pod source wrote are the admin's only when they are these; otherwise the
    # pod's own processes wrote them (a tenant can write its region), which raises no ceiling.
    _by_admin: dict[tuple[str, str], dict[str, DeviceLimits]] = field(default_factory=dict)
    _foreign_said: set[tuple[tuple[str, str], int]] = field(default_factory=set)  # logged
    _restored_said: set[tuple[tuple[str, str], int]] = field(default_factory=set)  # logged
    _deleted_said: set[tuple[tuple[str, str], str]] = field(default_factory=set)  # logged, what
    # The pods deleted while workers still charge their file, by its identity: a mark a process
    # of the pod clears is set again (undeleted, the pod came back with the words its tenant
    # wrote, held as a new pod's). Kept across the daemon's restarts (deleted_pods.py).
    _deleting: DeletedPods | None = None
    # The freezes the daemon made or found, by pod, kept across its restarts (held_freezes.py).
    _held_freezes: HeldFreezes | None = None
    _freezes_said: set[tuple[str, str]] = field(default_factory=set)  # cleared ones logged
    # Called with (namespace, name) after the API changed a pod's limits, outside the store's
    # lock: the pod source books the admin's change at once (it outlives a restart there).
    admin_listeners: list[Callable[[str, str], None]] = field(default_factory=list)
    # Each pod's scheduling class and weight as the daemon set them (or first read them), by
    # (namespace, name), with the identity of the region file they belong to: the words in the
    # region are the tenant's to write (its header too), and a weight written there must not
    # take contended time from other pods.
    # Kept across the daemon's restarts in {base}/.daemon/policies.json (private_file.py): a
    # daemon started after a tenant wrote its class or weight must not take them for the admin's.
    _policy: dict[tuple[str, str], tuple[tuple[int, int], int, int]] = field(default_factory=dict)
    _policy_file: PrivateFile | None = None
    # Each pod's limits by GPU as the daemon wrote them (or first read them): what it weighs
    # and shows, and sets raised words back to (held_limits.py).
    _held_limits: HeldLimits | None = None

    def __post_init__(self) -> None:
        self._policy_file = PrivateFile(self.base / POLICY_FOLDER, POLICY_FILE)
        if (self.base / POLICY_FOLDER).is_dir():
            self._policy = _decode_policies(self._policy_file.load())
        self._held_limits = HeldLimits(self.base / POLICY_FOLDER)
        self._held_freezes = HeldFreezes(self.base / POLICY_FOLDER)
        self._deleting = DeletedPods(self.base / POLICY_FOLDER)

    def _held(self) -> HeldLimits:
        assert self._held_limits is not None
        return self._held_limits

    def _freezes(self) -> HeldFreezes:
        assert self._held_freezes is not None
        return self._held_freezes

    def _deleted_pods(self) -> DeletedPods:
        assert self._deleting is not None
        return self._deleting

    def _remember_policies(
        self, before: dict[tuple[str, str], tuple[tuple[int, int], int, int]]
    ) -> None:
        if self._policy != before and self._policy_file is not None:
            self._policy_file.save(_encode_policies(self._policy))

    # Reading

    def scan(self) -> list[PodRecord]:
        """Every pod under the base path, sorted by namespace and name."""
        with self._lock:
            found = sorted(self._region_files())
            self._deleted_pods().keep_only((namespace, name) for namespace, name, _ in found)
            for path in set(self._open) - {path for _, _, path in found}:
                self._close(path)
            records = [self._record(namespace, name, path) for namespace, name, path in found]
            return [record for record in records if not self._deleted(record)]

    def _deleted(self, record: PodRecord) -> bool:
        """Whether a pod is deleted (its files removed once its last worker is gone)."""
        try:
            if record.error is not None or not self._flagged_deleted(
                record.key, self._region(record.path)
            ):
                return False
            self.reap(record)
            if not self._region(record.path).processes:
                self._remove(record.path)
                self._deleted_pods().forget(record.key)
        except (RegionError, PodError):
            pass  # a file gone bad meanwhile: removed by a later scan, or deleted again
        return True

    def _flagged_deleted(self, key: PodKey, region: Region) -> bool:
        """Whether the pod's region is marked deleted by the daemon. The daemon forgets the
        limits it holds for a pod as it marks it (delete), so a mark on a file whose limits it
        still holds was written by a process of the pod: it is cleared, and logged once.
        Before, it was taken for the daemon's: the pod went out of the passes, which forgot
        its limits, class and freeze, and the tenant, clearing it again with 99.99 % and the
        critical class written, had them adopted as a new pod's."""
        current = self._open.get(region.path)
        if not region.flags & FLAG_DELETED:
            return current is not None and self._mark_again(key, current.identity, region)
        if current is None or not self._held().holds(key, current.identity):
            return True
        region.change_flags(clear=FLAG_DELETED)
        self._say_deleted_mark(key, "marked deleted in its region, not by a delete", "cleared")
        return False

    def _mark_again(self, key: PodKey, identity: tuple[int, int], region: Region) -> bool:
        """Set again the deleted mark of a pod the daemon deleted that a process of the pod
        cleared; whether it did."""
        if not self._deleted_pods().deleted(key, identity):
            return False
        region.change_flags(set=FLAG_DELETED)
        self._say_deleted_mark(
            key, "its deleted mark cleared in its region, not by a create", "set again"
        )
        return True

    def _say_deleted_mark(self, key: PodKey, what: str, done: str) -> None:
        """Log once per pod that a process of the pod wrote its deleted mark."""
        if (key, done) not in self._deleted_said:
            self._deleted_said.add((key, done))
            log.warning("pod %s/%s: %s (a process of the pod wrote it): mark %s", *key, what, done)

    def get(self, namespace: str, name: str) -> PodRecord:
        """One pod; PodNotFound if it has no region file."""
        path = self._path(namespace, name)
        with self._lock:
            record = self._record(namespace, name, path) if path.exists() else None
            if record is None or self._deleted(record):
                raise PodNotFound(f"no pod {namespace}/{name}")
            return record

    def _region_files(self) -> Iterator[tuple[str, str, Path]]:
        for namespace in _folders(self.base):
            for name in _folders(self.base / namespace):
                path = self.base / namespace / name / regions.REGION_FILE
                if _valid_name(namespace) and _valid_name(name) and path.exists():
                    yield namespace, name, path

    def _record(self, namespace: str, name: str, path: Path) -> PodRecord:
        try:
            region = self._region(path)
            return PodRecord(
                namespace,
                name,
                path,
                created_ns=region.created_ns,
                devices=tuple(region.devices),
                processes=tuple(region.processes),
                frozen=region.frozen,
                # Only for a frozen pod: the marks are in the device entries, a whole read.
                frozen_gpus=tuple(region.frozen_gpus()) if region.frozen else (),
                qos=region.qos,
                weight=region.weight,
            )
        except RegionError as error:
            self._close(path)
            return PodRecord(namespace, name, path, error=_one_line(error))

    def _region(self, path: Path, *, opening: bool = True) -> Region:
        """The mapped region of ``path``, checked against the file as it is now: a file that
        was replaced is mapped again, one that went bad raises RegionError."""
        try:
            info = path.stat()
        except FileNotFoundError:
            raise RegionError(f"{path}: no such pod region") from None
        except OSError as error:
            raise RegionError(f"{path}: cannot read: {error.strerror}") from None
        identity = (info.st_dev, info.st_ino)
        current = self._open.get(path)
        if current is not None and current.identity != identity:
            self._close(path)
            current = None
        if current is None:
            if not opening:
                raise RegionError(f"{path}: not open")
            current = _Open(regions.open_region(path), identity)
            self._open[path] = current
        problem = current.region.problem()
        if problem is not None:
            raise RegionError(f"{path}: {problem}")
        if current.region.writable:
            self._cut_back(path, current)
        return current.region

    def _cut_back(self, path: Path, current: _Open) -> None:
        """A region grown past its size is cut back (its tenant can write it; the file system
        is the node's), and that is logged once for the file."""
        try:
            held = current.region.cut_back()
        except OSError as error:
            raise RegionError(f"{path}: cannot cut back: {error.strerror}") from None
        if held is not None and not current.cut_back:
            current.cut_back = True
            log.warning(
                "%s: the pod's region held %s, past its %s; cut back (a process of the pod "
                "wrote it)",
                path,
                format_size(held),
                format_size(regions.REGION_SIZE),
            )

    def _close(self, path: Path) -> None:
        current = self._open.pop(path, None)
        if current is not None:
            current.region.close()

    def close(self) -> None:
        with self._lock:
            for path in list(self._open):
                self._close(path)

    # Changing

    def create(
        self,
        namespace: str,
        name: str,
        limits: Mapping[str, GpuLimits],
        *,
        owner: int | None = None,
        group: int | None = None,
    ) -> PodRecord:
        """A new pod with ``limits`` by GPU UUID (UNCHANGED: none), its region owned by
        ``owner``/``group`` when given (else the daemon's user); PodConflict if it exists."""
        path = self._path(namespace, name)
        devices = {uuid: _new_limits(uuid, wanted) for uuid, wanted in limits.items()}
        with self._lock:
            if path.exists() and self._takes_over(
                namespace, name, path, devices, owner=owner, group=group
            ):
                # Exactly what is asked, not merged with the words the old pod's file holds.
                return self._update(namespace, name, devices)[0]
            self._by_admin.pop((namespace, name), None)  # an earlier pod of that name's
            if path.exists():
                raise PodConflict(f"pod {namespace}/{name} already exists")
            try:
                created = regions.create_region(
                    path, namespace, name, devices, owner=owner, group=group
                )
            except RegionError as error:
                raise PodError(_one_line(error)) from None
            created.close()
            record = self._record(namespace, name, path)
            current = self._open.get(path)
            if current is not None:
                written = {device.uuid: device.limits for device in record.devices}
                self._held().wrote((namespace, name), current.identity, written)
            return record

    def _takes_over(
        self,
        namespace: str,
        name: str,
        path: Path,
        limits: Mapping[str, GpuLimits],
        *,
        owner: int | None,
        group: int | None,
    ) -> bool:
        """Revive a deleted pod's file that workers still charge; whether there was one. Its
        owner must be the one asked for (its workers can write it), and so must every GPU it
        lists (no entry leaves a region, and a GPU listed is the pod's to use); its class and
        weight start again from medium and none: before, the new pod took whatever the old
        pod's tenant had written while it was deleted, and kept the old owner's file."""
        try:
            region = self._region(path)
            if not self._flagged_deleted((namespace, name), region):
                return False
            info = path.stat()
            asked = (0 if owner is None else owner, group)
            workers = len([p for p in region.processes if regions.process_alive(p)])
            if info.st_uid != asked[0] or (group is not None and info.st_gid != group):
                raise PodConflict(
                    f"pod {namespace}/{name} was deleted while {workers} worker(s) still run, "
                    f"in a file of uid {info.st_uid} gid {info.st_gid}: create it with that "
                    "owner, or once they exit"
                )
            # Before, an old GPU not asked stayed in the file: the new pod's programs used it,
            # and the daemon, holding no limits there, set back no words written into it. (A
            # pod that asks for no GPU is held to none: its processes' words are its limits.)
            wanted = {uuid.lower() for uuid in limits}
            others = sorted({d.uuid for d in region.devices if d.uuid.lower() not in wanted})
            if others and wanted:
                raise PodConflict(
                    f"pod {namespace}/{name} was deleted while {workers} worker(s) still run, "
                    f"in a file that lists GPU {', '.join(others)}: create it with those GPUs "
                    "too, or once they exit"
                )
            region.set_policy(int(Qos.MEDIUM), 0)
            region.change_flags(clear=FLAG_DELETED)
        except RegionError as error:
            raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
        self._policy.pop((namespace, name), None)
        self._deleted_pods().forget((namespace, name))
        return True

    def update(
        self, namespace: str, name: str, limits: Mapping[str, GpuLimits], *, by_admin: bool = True
    ) -> PodRecord:
        """Change limits in place (running programs see them within a second); a GPU the pod
        has no entry for gets one. ``by_admin``: the API's change (admin_limits keeps it), not
        the pod source's."""
        with self._lock:
            record, written = self._update(namespace, name, limits)
            if by_admin:  # what was written, not read back: the tenant may write meanwhile
                self._by_admin.setdefault((namespace, name), {}).update(written)
        if by_admin:
            for listener in self.admin_listeners:
                listener(namespace, name)
        return record

    def admin_limits(self, namespace: str, name: str) -> dict[str, DeviceLimits]:
        """What the API last wrote into the pod's region since this daemon started, by GPU
        UUID in lower case."""
        with self._lock:
            return dict(self._by_admin.get((namespace, name), {}))

    def _update(
        self, namespace: str, name: str, limits: Mapping[str, GpuLimits]
    ) -> tuple[PodRecord, dict[str, DeviceLimits]]:
        """The record after the change, and the limits written by GPU (UUID in lower case)."""
        written: dict[str, DeviceLimits] = {}
        with self._lock:
            region = self._existing(namespace, name)
            opened = self._open.get(region.path)
            bases = {
                uuid: self._held().merge_base((namespace, name), opened.identity, uuid)
                for uuid in limits
                if opened is not None
            }
            _check_changes(region, limits, bases)
            try:
                for uuid, wanted in limits.items():
                    try:
                        written[uuid.lower()] = region.change_limits(uuid, wanted, bases.get(uuid))
                    except ValueError as error:  # the change itself (a burst without a limit)
                        raise PodError(f"GPU {uuid}: {_one_line(error)}") from None
                    except RegionError as error:  # the file's state (cut short): a conflict
                        raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
            finally:  # what was written is held, the GPUs before a refused one's included
                current = self._open.get(region.path)
                if written and current is not None:
                    self._held().wrote((namespace, name), current.identity, written)
            return self._record(namespace, name, region.path), written

    def delete(self, namespace: str, name: str, *, force: bool = False) -> PodRecord:
        """Remove a pod's region (and its folder). With live workers only when ``force``."""
        with self._lock:
            record = self.get(namespace, name)
            if record.error is None:
                self.reap(record)
                record = self.get(namespace, name)
            live = [process for process in record.processes if regions.process_alive(process)]
            if live and not force:
                pids = ", ".join(str(process.host_pid or process.pid) for process in live)
                raise PodConflict(
                    f"pod {namespace}/{name} has {len(live)} live worker(s) (pid {pids}); "
                    "delete with force to remove it anyway"
                )
            # Forgotten once the delete happens: refused, the pod keeps what the daemon holds
            # (forgotten first, a refused delete let the tenant's next raised words stand).
            self._by_admin.pop((namespace, name), None)  # not the next pod of that name's
            self._held().forget((namespace, name))
            # A pod made again under the name may get the file's inode, the identity a
            # freeze is held with: it would be frozen at the next pass.
            self._freezes().forget((namespace, name))
            if live:  # they keep charging the file: it stays until they are gone
                try:
                    region = self._region(record.path)
                    region.change_flags(set=FLAG_DELETED)
                except RegionError as error:  # the file's state (cut short under us): a conflict
                    raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
                self._deleted_pods().hold((namespace, name), self._open[region.path].identity)
                return record
            self._remove(record.path)
            self._deleted_pods().forget((namespace, name))
            return record

    def _remove(self, path: Path) -> None:
        self._close(path)
        folder = path.parent
        try:
            with suppress(IsADirectoryError):  # a folder planted as the region: rmtree takes it
                path.unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
            _remove_if_empty(folder.parent)
        except OSError as error:
            raise PodError(f"{path}: cannot remove: {error.strerror}") from None

    # Freeze and resume

    def freeze(self, namespace: str, name: str, uuid: str | None = None) -> PodRecord:
        """Freeze a pod (every GPU, or the GPU ``uuid``): its workers' next launches there wait
        until resume (or the hold runs out)."""
        with self._lock:
            region = self._existing(namespace, name)
            try:
                region.freeze(FREEZE_HOLD_S, uuid)
            except RegionError as error:  # the file's state (cut short under us): a conflict
                raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
            identity = self._open[region.path].identity
            gpus = self._freezes().gpus((namespace, name), identity) or frozenset()
            # A whole-pod freeze is None among them: it holds every GPU.
            self._freezes().hold((namespace, name), identity, gpus | {uuid})
            return self._record(namespace, name, region.path)

    def resume(self, namespace: str, name: str) -> PodRecord:
        """Resume a frozen pod; its waiting launches go on at once."""
        with self._lock:
            region = self._existing(namespace, name)
            try:
                region.resume()
            except RegionError as error:  # the file's state (cut short under us): a conflict
                raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
            self._freezes().forget((namespace, name))
            return self._record(namespace, name, region.path)

    def set_policy(self, namespace: str, name: str, qos: int | None, weight: int | None) -> None:
        """Change a pod's scheduling class and weight (None keeps one)."""
        with self._lock:
            region = self._existing(namespace, name)
            try:
                identity = self._open[region.path].identity
                known = self._policy.get((namespace, name))
                if known is not None and known[0] == identity:
                    known_qos, known_weight = known[1], known[2]
                else:
                    known_qos, known_weight = region.qos, region.weight
                policy = (
                    known_qos if qos is None else qos,
                    known_weight if weight is None else weight,
                )
                region.set_policy(*policy)
            except ValueError as error:
                raise PodError(_one_line(error)) from None
            except RegionError as error:  # the file's state (cut short under us): a conflict
                raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
            before = dict(self._policy)
            self._policy[(namespace, name)] = (identity, *policy)
            self._remember_policies(before)

    def held_policies(self, records: list[PodRecord]) -> dict[PodKey, tuple[int, int]]:
        """Each readable pod's (class, weight) as the daemon set them (or first read them from
        its file), from every pod of the node (``records``): what the scheduling policy
        weighs, never the words in the region, which are the tenant's to write. Words a tenant
        wrote over them are set back; the policies of pods gone are forgotten (not of
        unreadable ones)."""
        with self._lock:
            before = dict(self._policy)
            present = {record.key for record in records}
            for key in set(self._policy) - present:
                del self._policy[key]
            held = {r.key: self._held_policy(r) for r in records if r.error is None}
            self._remember_policies(before)
            return held

    def hold_limits(self, records: list[PodRecord]) -> list[PodRecord]:
        """The records (every pod of the node) with each GPU's limits as the daemon holds them
        where the region's words raise past those, which are set back (held_limits.py); the
        limits of pods gone are forgotten (not of unreadable ones)."""
        with self._lock:
            held = self._held()
            held.keep_only(record.key for record in records)
            return [self._within_held(held, record) for record in records]

    def _within_held(self, held: HeldLimits, record: PodRecord) -> PodRecord:
        current = self._open.get(record.path)
        if record.error is not None or current is None:
            return record
        record = self._entries_restored(held, record, current.region, current.identity)
        record = self._without_foreign(held, record, current.identity)
        raised = held.bound(record.key, current.identity, record.devices)
        if not raised:
            return record
        devices = []
        for device in record.devices:
            limits = raised.get(device.uuid.lower())
            if limits is None:
                devices.append(device)
                continue
            with suppress(RegionError, ValueError):
                current.region.set_limits(
                    device.uuid,
                    limits.memory_limit,
                    limits.compute_limit,
                    compute_soft_limit=limits.compute_soft_limit,
                    device_flags=limits.device_flags,
                )
            devices.append(
                replace(
                    device,
                    memory_limit=limits.memory_limit,
                    compute_limit=limits.compute_limit,
                    compute_soft_limit=limits.compute_soft_limit,
                    device_flags=limits.device_flags,
                )
            )
        return replace(record, devices=tuple(devices))

    def _entries_restored(
        self, held: HeldLimits, record: PodRecord, region: Region, identity: tuple[int, int]
    ) -> PodRecord:
        """The record with each held GPU back in the entry it was held in. A pod's running
        processes read the entry they found their GPU in for as long as they run: before, a
        tenant that renamed that entry to another GPU (or lowered the count of entries in
        use past it) and zeroed its limits ran unlimited, while the daemon passed the entry
        over as foreign and set nothing back."""
        by_index = {device.index: device.uuid.lower() for device in record.devices}
        moved = {
            index: uuid
            for uuid, index in held.entries(record.key, identity).items()
            if by_index.get(index) != uuid
        }
        if not moved:
            return record
        try:
            region.restore_entries(moved)
            devices = tuple(region.devices)
        except (RegionError, ValueError):
            return record
        for index, uuid in sorted(moved.items()):
            if (record.key, index) in self._restored_said:
                continue  # once per entry: a tenant doing it at every pass fills no log
            self._restored_said.add((record.key, index))
            log.warning(
                "pod %s/%s: entry %d of its region, GPU %s, was %s: put back",
                *record.key,
                index,
                uuid,
                "renamed " + by_index[index] if index in by_index else "hidden past the count",
            )
        return replace(record, devices=devices)

    def _without_foreign(
        self, held: HeldLimits, record: PodRecord, identity: tuple[int, int]
    ) -> PodRecord:
        """The record without the device entries that are not the pod's: a second entry of a
        GPU, and an entry of a GPU the daemon holds no limits on (held_limits.py says when a
        new one is the pod's). The limiter adds no GPU to a pod whose region lists some (it
        keeps to them), so only a process that writes the file can have: weighed, an entry of
        99.99 % for a GPU the pod did not have cut the pods there from 60 % to 37 %, and eight
        copies of one entry a 60 % pod beside it to 20 %."""
        held_gpus = held.held_gpus(record.key, identity)
        seen: set[str] = set()
        kept = []
        for device in record.devices:
            uuid = device.uuid.lower()
            if uuid in seen or (held_gpus is not None and uuid not in held_gpus):
                if (record.key, device.index) not in self._foreign_said:
                    self._foreign_said.add((record.key, device.index))
                    log.warning(
                        "pod %s/%s: entry %d of its region (GPU %s) is not one the daemon "
                        "made: not weighed or shown (a process of the pod wrote it)",
                        *record.key,
                        device.index,
                        device.uuid,
                    )
                continue
            seen.add(uuid)
            kept.append(device)
        return record if len(kept) == len(record.devices) else replace(record, devices=tuple(kept))

    def _held_policy(self, record: PodRecord) -> tuple[int, int]:
        current = self._open.get(record.path)
        if current is None:
            return (record.qos, record.weight)
        known = self._policy.get(record.key)
        if known is None or known[0] != current.identity:  # a new pod, or its file made anew
            known = (current.identity, record.qos, record.weight)
            self._policy[record.key] = known
        policy = (known[1], known[2])
        if policy != (record.qos, record.weight):
            with suppress(RegionError, ValueError):
                current.region.set_policy(*policy)
        return policy

    def publish_effective(self, effective: Mapping[PodKey, Mapping[int, int]]) -> None:
        """Write each pod's effective compute limit by device entry (the scheduling policy's
        result) into its region."""
        self._publish(effective, Region.set_effective)

    def publish_burst(self, rates: Mapping[PodKey, Mapping[int, int]]) -> None:
        """Write each bursting pod's burst rate by device entry (what it may run at while others
        want the GPU) into its region."""
        self._publish(rates, Region.set_burst)

    def _publish(
        self, values: Mapping[PodKey, Mapping[int, int]], write: Callable[[Region, int, int], None]
    ) -> None:
        """Write a scheduler word by pod and device entry; a file that went or changed since
        the scan is left alone."""
        with self._lock:
            for (namespace, name), by_entry in values.items():
                path = self._path(namespace, name)
                for index, value in by_entry.items():
                    with suppress(RegionError):
                        write(self._region(path, opening=False), index, value)

    def renew_freezes(self, records: list[PodRecord]) -> None:
        """Extend the hold of every frozen pod; clear the flag of a freeze that ran out. A freeze
        the daemon made and a process of the pod cleared or put past its deadline (it can write
        its region) is made again, and logged once: before, the pod ran on and read as not
        frozen."""
        with self._lock:
            self._freezes().keep_only(record.key for record in records)
            for record in records:
                if record.error is not None:
                    continue
                # ValueError: a freeze held by a GPU name that is none (an earlier version
                # adopted one a tenant wrote): that pod's, not every pod's pass.
                with suppress(RegionError, ValueError):
                    region = self._region(record.path, opening=False)
                    if not region.flags & FLAG_FROZEN:
                        self._freeze_again(record, region)
                        continue
                    if region.freeze_until_ns > time.monotonic_ns():
                        self._adopt_freeze(record, region)
                        if self._narrowed(record.key, region):
                            self._freeze_again(record, region)
                        region.renew_freeze(FREEZE_HOLD_S)
                    # The daemon's own freeze, renewed every pass, runs out only where a process
                    # of the pod wrote its deadline past: made again (resumed, the tenant ended
                    # the admin's freeze).
                    elif not self._freeze_again(record, region):
                        region.resume()
                        self._freezes().forget(record.key)

    def _adopt_freeze(self, record: PodRecord, region: Region) -> None:
        """Hold as its own a freeze the daemon renews without having made it: an earlier
        daemon's, found frozen after a restart. Before, only the freezes made through this
        daemon's API were made again, so after a restart a process of the pod cleared the flag
        and the pod ran on, read as not frozen."""
        current = self._open.get(record.path)
        if current is None or self._freezes().gpus(record.key, current.identity) is not None:
            return
        # Only the marks on entries that name a GPU: an entry's UUID is the tenant's to write,
        # and a freeze held by a name that is none made the pass that froze the pod again fail
        # (ValueError) for every pod, pass after pass.
        marks: set[str | None] = set(_gpu_uuids(region.frozen_gpus()))
        self._freezes().hold(record.key, current.identity, marks or {None})

    def _narrowed(self, key: PodKey, region: Region) -> bool:
        """Whether the region's freeze holds fewer GPUs than the one the daemon made: a process
        of the pod marked some GPUs of a whole-pod freeze (it then holds those only), or cleared
        the mark of one it froze. Marks on none hold every GPU."""
        current = self._open.get(region.path)
        known = None if current is None else self._freezes().gpus(key, current.identity)
        marks = {uuid.lower() for uuid in region.frozen_gpus()}
        if known is None or not marks:
            return False
        return None in known or not {gpu.lower() for gpu in known if gpu} <= marks

    def _freeze_again(self, record: PodRecord, region: Region) -> bool:
        """Make again a freeze the daemon made (cleared, narrowed to fewer GPUs, or its deadline
        put past, in the region); whether there was one."""
        current = self._open.get(record.path)
        known = None if current is None else self._freezes().gpus(record.key, current.identity)
        if known is None:
            return False
        for uuid in sorted(known, key=lambda gpu: gpu or ""):
            region.freeze(FREEZE_HOLD_S, uuid)
        if record.key not in self._freezes_said:
            self._freezes_said.add(record.key)
            log.warning(
                "pod %s/%s: its freeze was cleared or narrowed in its region, not by a resume (a "
                "process of the pod wrote it): frozen again",
                *record.key,
            )
        return True

    def reap(self, record: PodRecord) -> list[ProcessInfo]:
        """Give the memory of the pod's dead workers back; the slots reclaimed."""
        with self._lock:
            try:
                return self._region(record.path, opening=False).reap()
            except RegionError:
                return []

    def set_host_pid(self, record: PodRecord, process: ProcessInfo, host_pid: int) -> None:
        with self._lock, suppress(RegionError):
            self._region(record.path, opening=False).set_host_pid(process, host_pid)

    def _existing(self, namespace: str, name: str) -> Region:
        path = self._path(namespace, name)
        if not path.exists():
            raise PodNotFound(f"no pod {namespace}/{name}")
        try:
            region = self._region(path)
        except RegionError as error:
            raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
        try:
            deleted = self._flagged_deleted((namespace, name), region)
        except RegionError as error:
            raise PodConflict(f"pod {namespace}/{name}: {_one_line(error)}") from None
        if deleted:
            raise PodNotFound(f"no pod {namespace}/{name}")
        return region

    def _path(self, namespace: str, name: str) -> Path:
        try:
            return regions.region_path(self.base, namespace, name)
        except ValueError as error:
            raise PodError(str(error)) from None


def _check_changes(
    region: Region,
    limits: Mapping[str, GpuLimits],
    bases: Mapping[str, Callable[[DeviceLimits], DeviceLimits]],
) -> None:
    """PodError naming the first GPU whose change cannot be made over what it has (as
    ``bases`` make it of the words, by GPU, as Region.change_limits does), before any is
    written: a change refused is no change (before, the GPUs named ahead of it were written
    and the request answered 422)."""
    present = {device.uuid.lower(): device for device in region.devices}
    for uuid, wanted in limits.items():
        device = present.get(uuid.lower())
        merge = bases.get(uuid)
        try:
            words = None if device is None else device.limits
            words = words if words is None or merge is None else merge(words)
            base = NO_LIMITS if words is None else words.value
        except ValueError:
            continue  # words that cannot be, a tenant's: the file's state, its write says so
        try:
            wanted.over(base)
        except ValueError as error:
            raise PodError(f"GPU {uuid}: {_one_line(error)}") from None


def _gpu_uuids(names: Iterable[str]) -> list[str]:
    """The names that are GPU UUIDs, as NVML writes them."""
    found = []
    for name in names:
        with suppress(ValueError):
            found.append(normalize_uuid(name))
    return found


def _new_limits(uuid: str, wanted: GpuLimits) -> GpuLimits:
    """A new GPU's limits: the change over none; PodError naming the GPU when they cannot be."""
    try:
        return wanted.over(NO_LIMITS)
    except ValueError as error:
        raise PodError(f"GPU {uuid}: {_one_line(error)}") from None


def _folders(path: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _valid_name(name: str) -> bool:
    try:
        regions.check_name("name", name)
    except ValueError:
        return False
    return True


def _remove_if_empty(folder: Path) -> None:
    with suppress(OSError):  # not empty, or gone
        folder.rmdir()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


# {base}/.daemon/policies.json: [{"namespace", "name", "region": [st_dev, st_ino], "qos", "weight"}]


def _encode_policies(
    policies: Mapping[tuple[str, str], tuple[tuple[int, int], int, int]],
) -> list[dict[str, Any]]:
    return [
        {"namespace": ns, "name": name, "region": list(identity), "qos": qos, "weight": weight}
        for (ns, name), (identity, qos, weight) in sorted(policies.items())
    ]


def _decode_policies(document: Any) -> dict[tuple[str, str], tuple[tuple[int, int], int, int]]:
    """The policies a file holds; none from one that is not a list of such entries (said)."""
    policies: dict[tuple[str, str], tuple[tuple[int, int], int, int]] = {}
    if document is None:
        return policies
    try:
        for key, identity, entry in pod_entries(document):
            qos, weight = entry["qos"], entry["weight"]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (qos, weight)):
                raise TypeError("a class or weight that is not a whole number")
            policies[key] = (identity, qos, weight)
    except (TypeError, KeyError, ValueError) as error:
        log.warning("%s/%s: cannot read: %s; starting afresh", POLICY_FOLDER, POLICY_FILE, error)
        return {}
    return policies
