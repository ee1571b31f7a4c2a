"""Which pod an Allocate was for, learnt from the kubelet instead of guessed.

The kubelet's Allocate names devices, never the pod or the container. So Allocate answers with
an *allocation*: an ID of its own and a folder, ``{base}/.allocations/{id}``, that the container
mounts as its pod folder. Once Allocate has answered, the kubelet lists the devices under the
pod and container it gave them to (PodResources ``List``, pod_resources.py); the binder (a
thread, one pass every ``poll_s`` while an allocation is unbound, else every ``idle_s``) finds
the one pod that holds an allocation's devices, has the pod's region made with its limits on
those GPUs (the ``bind`` callback: the resolver and the PodStore, as before), and links the
region into the allocation's folder (a hard link, ``shm``). The container's processes wait for
it (``TF_REGION_WAIT``); a pod's containers (init containers and sidecars included) each have
their own folder and all share the pod's one region.

- A device is held by one pod at a time, so two pods of the same shape, admitted in any order,
  each get their own region. A plain init container is not listed by the kubelet; its devices
  are, under the pod's later containers that ask for as many, which the kubelet gives them
  first. An init container whose devices no later container reuses stays unbound (its
  processes fail after the wait, with one line) and is logged.
- The allocations are kept in ``{base}/.kubernetes/allocations.json`` (private_file.py), so a
  daemon that restarts binds what the last one could not and keeps what it bound.
- A pod the ``bind`` callback refuses (``Refused``: the GPUs the kubelet gave cannot hold it,
  device_plugin/accounting.py) is never linked: the allocation is kept as refused, with the pod,
  and not tried again, so that its container's processes fail after the wait and the refusal
  is told once.
- A bound allocation is removed with its folder once its pod no longer holds its devices and
  the pod source (``live``) no longer has the pod, or has it ended, for ``forget_s``; one never
  bound, after ``stale_s`` (its pod was refused after Allocate). The kubelet's list alone is not
  enough: a kubelet restarted while the API server is out of reach lists no pod until it reaches
  it, while the containers run on with their folders (and the regions' links in them) mounted.
  While the pod source does not know (``live`` gives None, or there is none), nothing bound is
  removed.
  The link follows the pod's region: made again, it is linked again; removed (an admin's
  delete), the link goes too, so that the container's next processes find none.
- A reboot wipes the base path (a tmpfs), the allocations file with it, while the kubelet
  restarts the pods from its checkpoint without a new Allocate: their containers mount the old
  folders. So the allocations the daemon does not know are booked again, unbound, from the
  kubelet's checkpoint (``lost``, checkpoint.py) when it starts, and when a pass finds a folder
  it does not know; the binder then binds them as any other. A folder the checkpoint names is
  never removed as unknown.

Security: the allocation folders are the daemon's (``.allocations`` 0711, each 0755, root's),
mounted read-write into one container each. The daemon opens everything in them and in pod
folders relative to a folder opened with ``O_NOFOLLOW``, never follows a link a tenant could
have planted there, and replaces ``shm`` by a rename (which replaces a planted name, never
writes through it). The limiter accepts the region's other hard links only in a folder only
root can write (region_file.c).
"""

import contextlib
import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vgpu_hypervisor.daemon.private_file import PrivateFile
from vgpu_hypervisor.device_plugin.accounting import LivePods
from vgpu_hypervisor.device_plugin.checkpoint import CheckpointError, Mounted
from vgpu_hypervisor.device_plugin.pod_resources import Holder, PodResources, PodResourcesError
from vgpu_hypervisor.device_plugin.resources import gpu_of
from vgpu_hypervisor.kubernetes.model import KubePod

log = logging.getLogger("vgpu_hypervisor.device_plugin")
FOLDER: Final = ".allocations"  # under the base path
BOOK_FOLDER: Final = ".kubernetes"  # the daemon's own (pod_book.py)
BOOK_FILE: Final = "allocations.json"
REGION: Final = "shm"
_NEW: Final = ".shm.new"
_ID: Final = re.compile(r"[0-9a-f]{32}")
_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# The pod's region made (or kept) with its limits on these GPUs; raises when it cannot be.
BindPod = Callable[[KubePod, str, Sequence[str], str], None]  # pod, container, GPUs, allocation
FindPod = Callable[[str, str], KubePod | None]  # (namespace, name) → the pod, when known
# The allocation folders the kubelet's checkpoint mounts (by name: the pod UID and devices);
# CheckpointError when it cannot be read.
LostFolders = Callable[[], Mapping[str, Mounted]]


class BindingError(Exception):
    """An allocation cannot be made or linked; one line."""


class Refused(Exception):
    """Raised by ``bind``: the pod must not have the allocation's GPUs (one line, why); the
    allocation is left without a region for good."""


@dataclass
class Allocation:
    id: str
    devices: tuple[str, ...]
    made: float  # wall-clock seconds
    pod: tuple[str, str] | None = None  # (namespace, name) once bound
    uid: str = ""  # its pod's (found again in the kubelet's checkpoint: before it is bound)
    container: str = ""
    refused: str = ""  # why its pod was refused (no region is linked), else ""
    absent_since: float | None = None  # not kept: since when the pod no longer holds it
    said: str = ""  # not kept: the last problem logged

    @property
    def gpus(self) -> list[str]:
        return sorted({gpu_of(one) for one in self.devices})


class Bindings:
    """The allocations of one node, their folders and the binder thread."""

    def __init__(
        self,
        base: Path,
        pod_resources: PodResources,
        find: FindPod,
        bind: BindPod,
        *,
        poll_s: float = 1.0,
        idle_s: float = 10.0,
        forget_s: float = 60.0,
        stale_s: float = 600.0,
        live: LivePods | None = None,
        lost: LostFolders | None = None,
    ) -> None:
        """``live``: the UIDs of the pods the pod source has, not ended (None: not known);
        ``lost``: where allocations a reboot wiped are found again (None: nowhere)."""
        self.base = base
        self.folder = base / FOLDER
        self._pod_resources = pod_resources
        self._find = find
        self._bind = bind
        self._poll_s = poll_s
        self._idle_s = idle_s
        self._forget_s = forget_s
        self._stale_s = stale_s
        self._live = live
        self._lost = lost
        self._checkpoint_said = ""
        # The unknown folders of the last look in the checkpoint, and when (monotonic).
        self._looked: tuple[frozenset[str], float] | None = None
        self._book = PrivateFile(base / BOOK_FOLDER, BOOK_FILE)
        self._lock = threading.Lock()
        self._passing = threading.Lock()  # one pass at a time: the binder's, or settle()'s
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._kubelet_said = ""
        self._allocations: dict[str, Allocation] = {}
        self._load()

    # Allocate

    def allocate(self, devices: Sequence[str]) -> Allocation:
        """A new allocation of ``devices`` with its (empty) folder, kept before Allocate
        answers; the binder is woken."""
        allocation = Allocation(secrets.token_hex(16), tuple(sorted(devices)), time.time())
        with self._lock:
            self._make_folder(allocation.id)
            self._allocations[allocation.id] = allocation
            self._save()
        self._wake.set()
        return allocation

    def get(self, allocation_id: str) -> Allocation | None:
        with self._lock:
            return self._allocations.get(allocation_id)

    def all(self) -> list[Allocation]:
        with self._lock:
            return list(self._allocations.values())

    def path(self, allocation_id: str) -> Path:
        return self.folder / allocation_id

    def remove(self, allocation_id: str, why: str) -> None:
        """The allocation and its folder gone now (an Allocate that failed after making it)."""
        found = self.get(allocation_id)
        if found is not None and self._forget(found, why):
            with self._lock:
                self._save()

    # The binder

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="allocation-binder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._pod_resources.close()

    def _run(self) -> None:
        while not self._stopping:
            try:
                self.bind_pass()
            except Exception as error:  # a bug must not end the binder: said, tried again
                log.error("allocation binder: %s: %s", type(error).__name__, error)
            unbound = any(a.pod is None for a in self.all())
            self._wake.wait(self._poll_s if unbound else self._idle_s)
            self._wake.clear()

    def settle(self) -> None:
        """A pass now, outside the binder's rhythm: before GetPreferredAllocation places the
        next pod, the pod admitted just before it (its Allocate answered, the kubelet's list
        already naming it) is bound and charged, so its GPU's room is known."""
        try:
            self.bind_pass()
        except Exception as error:  # as in the binder: said; its next pass tries again
            log.error("allocation binder: %s: %s", type(error).__name__, error)

    def bind_pass(self) -> None:
        """One look at the kubelet's list: bind, relink, forget."""
        with self._passing:
            self._bind_pass()

    def _bind_pass(self) -> None:
        self._look_for_lost()
        allocations = self.all()
        if not allocations:
            return
        try:
            holders = self._pod_resources.holders()
        except PodResourcesError as error:
            if str(error) != self._kubelet_said:
                log.warning("allocations wait: %s", error)
                self._kubelet_said = str(error)
            return
        self._kubelet_said = ""
        pods: dict[str, set[tuple[str, str]]] = {}  # device → the pods holding it
        for holder in holders:
            for one in holder.devices:
                pods.setdefault(one, set()).add((holder.namespace, holder.pod))
        now = time.time()
        live = self._live() if self._live is not None else None
        changed = False
        for allocation in allocations:
            holding = {pod for one in allocation.devices for pod in pods.get(one, ())}
            if allocation.pod is None:
                changed |= self._try_bind(allocation, holding, holders, now)
            else:
                changed |= self._follow(allocation, holding, live, now)
        if changed:
            with self._lock:
                self._save()

    def _try_bind(
        self,
        allocation: Allocation,
        holding: set[tuple[str, str]],
        holders: Sequence[Holder],
        now: float,
    ) -> bool:
        if len(holding) > 1:
            names = ", ".join(f"{ns}/{name}" for ns, name in sorted(holding))
            self._say(allocation, f"its devices are held by several pods ({names}): not bound")
            return False
        if not holding:
            if now - allocation.made >= self._stale_s:
                return self._forget(allocation, "no pod was ever listed with its devices")
            if now - allocation.made >= min(30.0, self._stale_s):
                self._say(
                    allocation,
                    "no container the kubelet lists holds its devices (a GPU only a plain init "
                    "container asks for is listed under no container): not bound yet",
                )
            return False
        namespace, name = next(iter(holding))
        pod = self._holder(allocation, namespace, name)
        if pod is None:
            return False
        container = _container(allocation, namespace, name, holders)
        try:
            self._bind(pod, container, allocation.gpus, allocation.id)
        except Refused as error:  # final: kept with its pod, never linked, not tried again
            refused = _one_line(error)
        except Exception as error:  # said once, tried again at the next pass
            self._say(allocation, f"pod {pod.key}: cannot bind: {_one_line(error)}")
            return False
        else:
            refused = ""
        allocation.pod, allocation.uid, allocation.container = (namespace, name), pod.uid, container
        allocation.refused, allocation.said = refused, ""
        # Kept before the region appears in the folder: a daemon stopped the moment a process
        # can find its region still knows the binding when it starts again. A link that fails
        # now is made by the next pass (_follow_region), as for any bound allocation.
        with self._lock:
            self._save()
        if not refused:
            self._follow_region(allocation)
        if refused:
            log.warning("allocation %s refused, no region linked: %s", allocation.id, refused)
        else:
            log.info(
                "allocation %s is pod %s container %s (%s)",
                allocation.id,
                pod.key,
                container,
                ",".join(allocation.gpus),
            )
        return True

    def _holder(self, allocation: Allocation, namespace: str, name: str) -> KubePod | None:
        """The pod holding the allocation's devices, when known and the one it may be bound
        to (found again in the checkpoint: the pod named there, not a later one of its name)."""
        pod = self._find(namespace, name)
        if pod is None:
            self._say(allocation, f"held by pod {namespace}/{name}, not known yet: not bound yet")
        elif allocation.uid and allocation.uid != pod.uid:
            self._say(allocation, f"held by pod {pod.key} now, not by pod {allocation.uid}")
            return None
        return pod

    def _follow(
        self,
        allocation: Allocation,
        holding: set[tuple[str, str]],
        live: Collection[str] | None,
        now: float,
    ) -> bool:
        """A bound allocation: its link follows its pod's region while the kubelet lists the
        pod; it is forgotten (True) once neither the kubelet nor the pod source (``live``) has
        the pod for ``forget_s``."""
        if allocation.pod in holding:
            allocation.absent_since = None
            if not allocation.refused:
                self._follow_region(allocation)
            return False
        if live is None or allocation.uid in live:
            # Not on the kubelet's list alone: one restarted while the API server is out of
            # reach lists no pod, while their containers run on with this folder mounted.
            allocation.absent_since = None
            return False
        allocation.absent_since = allocation.absent_since or now
        if now - allocation.absent_since < self._forget_s:
            return False
        return self._forget(allocation, "its pod is gone (the kubelet and the pod source agree)")

    def _look_for_lost(self) -> None:
        """Folders no allocation has (a container the kubelet restarted from its checkpoint
        mounts one): the checkpoint read again when they change, else once per ``forget_s``."""
        try:
            names = {e.name for e in os.scandir(self.folder) if _ID.fullmatch(e.name)}
        except OSError:
            return
        unknown = frozenset(names - {a.id for a in self.all()})
        now = time.monotonic()
        if not unknown or (
            self._looked is not None
            and self._looked[0] == unknown
            and now - self._looked[1] < self._forget_s
        ):
            return
        self._looked = unknown, now
        if self._recover():
            self._wake.set()

    def _recover(self) -> set[str]:
        """The allocations the checkpoint names that the daemon does not know, booked unbound
        with their folders; the IDs it names (none when it cannot be read: said once)."""
        if self._lost is None:
            return set()
        try:
            named = {k: v for k, v in self._lost().items() if _ID.fullmatch(k)}
        except CheckpointError as error:
            if str(error) != self._checkpoint_said:
                log.warning("the kubelet's checkpoint is not used: %s", error)
                self._checkpoint_said = str(error)
            return set()
        self._checkpoint_said = ""
        with self._lock:
            found = [(k, devices) for k, devices in named.items() if k not in self._allocations]
            for allocation_id, (uid, devices) in found:
                try:
                    self._make_folder(allocation_id, exist_ok=True)
                except BindingError as error:
                    log.warning("allocation %s not found again: %s", allocation_id, error)
                    continue
                allocation = Allocation(allocation_id, devices, time.time(), uid=uid)
                self._allocations[allocation_id] = allocation
                log.info(
                    "allocation %s (%s) found again in the kubelet's checkpoint: binding it",
                    allocation_id,
                    ",".join(allocation.devices),
                )
            if found:
                self._save()
        return set(named)

    def _say(self, allocation: Allocation, problem: str) -> None:
        if problem != allocation.said:
            devices = ",".join(allocation.devices)
            log.warning("allocation %s (%s): %s", allocation.id, devices, problem)
            allocation.said = problem

    def _follow_region(self, allocation: Allocation) -> None:
        """The link made again when the pod's region was; removed when it is gone."""
        assert allocation.pod is not None
        pod = namespace, name = allocation.pod
        try:
            self._link(allocation.id, namespace, name)
            return
        except FileNotFoundError:
            pass  # the pod's region (or the allocation's folder) is gone
        except (OSError, BindingError) as error:
            self._say(allocation, f"cannot link its pod's region: {_one_line(error)}")
            return
        try:
            with self._folder_fd(allocation.id) as folder:
                os.unlink(REGION, dir_fd=folder)
            log.info("allocation %s: pod %s/%s has no region now", allocation.id, *pod)
        except FileNotFoundError:
            pass
        except OSError as error:
            self._say(allocation, f"cannot unlink a region gone: {_one_line(error)}")

    def _forget(self, allocation: Allocation, why: str) -> bool:
        with self._lock:
            self._allocations.pop(allocation.id, None)
        shutil.rmtree(self.path(allocation.id), ignore_errors=True)  # never follows a link
        bound = f" (pod {allocation.pod[0]}/{allocation.pod[1]})" if allocation.pod else ""
        log.info("allocation %s%s removed: %s", allocation.id, bound, why)
        return True

    # Files

    @contextlib.contextmanager
    def _folder_fd(self, allocation_id: str) -> Iterator[int]:
        with _opened(self.base, FOLDER, allocation_id) as folder:
            yield folder

    def _make_folder(self, allocation_id: str, *, exist_ok: bool = False) -> None:
        """``exist_ok``: one there already (the container runtime makes a missing mount
        source) is taken when it is a folder of the daemon's user, never through a link."""
        try:
            self.folder.mkdir(mode=0o711, exist_ok=True)
            with _opened(self.base, FOLDER) as parent:
                _check_root_only(parent, self.folder)
                os.fchmod(parent, 0o711)
                try:
                    os.mkdir(allocation_id, 0o755, dir_fd=parent)
                except FileExistsError:
                    if not exist_ok:
                        raise
                with _opened_at(parent, allocation_id) as made:
                    if os.fstat(made).st_uid != os.geteuid():
                        raise BindingError(f"{self.path(allocation_id)}: not the daemon's own")
                    os.fchmod(made, 0o755)  # whatever the umask
        except OSError as error:
            where = self.path(allocation_id)
            raise BindingError(f"{where}: cannot make: {error.strerror}") from None

    def _link(self, allocation_id: str, namespace: str, name: str) -> None:
        """``shm`` in the allocation's folder made the pod's region (unless it is);
        FileNotFoundError when the pod has no region."""
        with _opened(self.base, namespace, name) as pod_folder:
            _check_root_only(pod_folder, self.base / namespace / name)
            region = os.open(REGION, _FILE, dir_fd=pod_folder)
        try:
            info = os.fstat(region)
            if not stat.S_ISREG(info.st_mode):
                raise BindingError(f"{self.base / namespace / name / REGION}: not a regular file")
            with self._folder_fd(allocation_id) as folder:
                try:
                    now = os.stat(REGION, dir_fd=folder, follow_symlinks=False)
                    if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                        return
                except FileNotFoundError:
                    pass
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_NEW, dir_fd=folder)
                os.link(f"/proc/self/fd/{region}", _NEW, dst_dir_fd=folder, follow_symlinks=True)
                os.rename(_NEW, REGION, src_dir_fd=folder, dst_dir_fd=folder)
                with contextlib.suppress(FileNotFoundError):  # rename of a name to itself
                    os.unlink(_NEW, dir_fd=folder)
        finally:
            os.close(region)

    def _load(self) -> None:
        document = self._book.load()
        entries = document.get("allocations") if isinstance(document, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            allocation = _decode(entry)
            if allocation is None:
                log.warning("%s: an entry that is not an allocation is dropped", self._book.path)
                continue
            self._allocations[allocation.id] = allocation
        kept = set(self._allocations) | self._recover()
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.folder):
                if entry.name not in kept:  # made by a daemon that stopped before keeping it
                    shutil.rmtree(self.folder / entry.name, ignore_errors=True)
        for allocation in list(self._allocations.values()):
            if not self.path(allocation.id).is_dir():
                try:
                    self._make_folder(allocation.id)
                except BindingError as error:
                    log.warning("allocation %s dropped: %s", allocation.id, error)
                    del self._allocations[allocation.id]
        if self._allocations:
            bound = sum(a.pod is not None and not a.refused for a in self._allocations.values())
            refused = sum(bool(a.refused) for a in self._allocations.values())
            log.info(
                "allocations: %d kept, %d of them bound, %d refused",
                len(self._allocations),
                bound,
                refused,
            )

    def _save(self) -> None:
        self._book.save({"allocations": [_encode(a) for a in self._allocations.values()]})


def _container(allocation: Allocation, namespace: str, name: str, holders: Sequence[Holder]) -> str:
    """The container the kubelet lists with exactly these devices; else (an init container's,
    which a later container reuses) the first that holds some of them."""
    mine = [h for h in holders if (h.namespace, h.pod) == (namespace, name)]
    wanted = frozenset(allocation.devices)
    exact = [h.container for h in mine if h.devices == wanted]
    if exact:
        return exact[0]
    reusing = [h.container for h in mine if h.devices & wanted]
    return f"(an init container; its devices now {reusing[0]}'s)" if reusing else "?"


@contextlib.contextmanager
def _opened(base: Path, *names: str) -> Iterator[int]:
    """A descriptor of ``base/names...``, each step opened relative to the last without
    following a link (a planted symbolic link is ELOOP or ENOTDIR, never followed)."""
    fd = os.open(base, _DIRECTORY)
    try:
        for name in names:
            if not name or "/" in name or name in (".", ".."):
                raise BindingError(f"{name!r}: not a plain name")
            step = os.open(name, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = step
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _opened_at(folder: int, name: str) -> Iterator[int]:
    fd = os.open(name, _DIRECTORY, dir_fd=folder)
    try:
        yield fd
    finally:
        os.close(fd)


def _check_root_only(fd: int, path: Path) -> None:
    """A folder of the daemon's own user that nobody else may write (its group aside when it is
    the daemon's): the limiter accepts a region's extra links only in such folders."""
    info = os.fstat(fd)
    group_writes = bool(info.st_mode & stat.S_IWGRP) and info.st_gid != os.getegid()
    if info.st_uid != os.geteuid() or info.st_mode & stat.S_IWOTH or group_writes:
        raise BindingError(f"{path}: not the daemon's own folder (owner {info.st_uid})")


def _encode(allocation: Allocation) -> dict[str, Any]:
    return {
        "id": allocation.id,
        "devices": list(allocation.devices),
        "made": allocation.made,
        "pod": list(allocation.pod) if allocation.pod else None,
        "uid": allocation.uid,
        "container": allocation.container,
        "refused": allocation.refused,
    }


def _decode(entry: Any) -> Allocation | None:
    if not isinstance(entry, dict):
        return None
    allocation_id, devices, made = entry.get("id"), entry.get("devices"), entry.get("made")
    pod, uid, container = entry.get("pod"), entry.get("uid", ""), entry.get("container", "")
    refused = entry.get("refused", "")
    if (
        not isinstance(allocation_id, str)
        or not _ID.fullmatch(allocation_id)
        or not isinstance(devices, list)
        or not all(isinstance(one, str) for one in devices)
        or not isinstance(made, int | float)
        or not isinstance(uid, str)
        or not isinstance(container, str)
        or not isinstance(refused, str)
        or not (
            pod is None
            or (isinstance(pod, list) and len(pod) == 2 and all(isinstance(p, str) for p in pod))
        )
    ):
        return None
    bound = (pod[0], pod[1]) if pod else None
    return Allocation(allocation_id, tuple(devices), float(made), bound, uid, container, refused)


def _one_line(error: BaseException) -> str:
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return " ".join(text.split())
