"""The limits the daemon holds for each pod, by GPU: what it wrote into the pod's region (a new
pod, an admin's change, the pod source's), or what it first read there.

A region is the tenant's file to write. The memory limit, the compute limit and its burst in it
are what the pod's own processes obey, so a tenant that raises them raises only its own ceiling
(the cooperative model, docs/security.md); but the daemon also divides a contended GPU by the
compute limits, and a compute limit written up to 99.99 % took contended time from every other
pod on the GPU (a victim at 40 % got 28 % beside a pod that launched nothing). So the daemon
weighs and shows a pod by the words it holds, and sets words raised past them back at each pass,
as it does the class and weight (policies.json). Words below what it holds are the pod's own to
choose: a limit the environment seeds into a region with none (the limiter's), or a tenant
lowering its own.

Held with the identity of the region file they belong to, and kept across the daemon's restarts
in ``{base}/.daemon/limits.json`` (private_file.py): a daemon started after a tenant raised its
words must not adopt them."""

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from vgpu_limiter.region import COMPUTE_UNLIMITED, MAX_DEVICES, DeviceInfo, DeviceLimits

from vgpu_hypervisor.daemon.private_file import PrivateFile, pod_entries

log = logging.getLogger(__name__)

LIMITS_FILE: Final = "limits.json"
ADOPTING_S: Final = 2.0
"""A pod the daemon did not make (a limiter's, read first) is on every GPU its region lists for
this long after the first read: its first process adds its GPUs one by one, and a pass may read
it between two. Later, a GPU entry the daemon holds no limits for is not the pod's: the limiter
adds none to a region that lists GPUs, so only a process writing the file can have."""

Identity = tuple[int, int]  # (st_dev, st_ino) of the region file
Key = tuple[str, str]  # (namespace, name)


def _compute(words: int) -> int:
    """A compute limit word as a number to compare: no limit (0, or the unlimited word and above)
    as the most."""
    return COMPUTE_UNLIMITED if words == 0 or words >= COMPUTE_UNLIMITED else words


def raises(words: DeviceLimits, held: DeviceLimits) -> bool:
    """Whether a region's words allow the pod more than the limits held for it."""
    memory_raised = held.memory_limit != 0 and not 0 < words.memory_limit <= held.memory_limit
    compute_raised = _compute(words.compute_limit) > _compute(held.compute_limit)
    # A burst counts above the hard limit only; none held is none above the held hard limit.
    held_burst = max(held.compute_soft_limit, _compute(held.compute_limit))
    burst_raised = max(words.compute_soft_limit, _compute(words.compute_limit)) > held_burst
    flags_raised = bool(words.device_flags & ~held.device_flags)
    return memory_raised or compute_raised or burst_raised or flags_raised


@dataclass
class HeldLimits:
    """Each pod's held limits by GPU UUID (lower case), with its region's identity. Not
    thread-safe: the pod store calls it under its lock."""

    folder: Path
    _held: dict[Key, tuple[Identity, dict[str, DeviceLimits]]] = field(default_factory=dict)
    _file: PrivateFile | None = None
    _said: set[tuple[Key, str]] = field(default_factory=set)  # raised words logged, by GPU
    # The entry (index) of the region each held GPU is in, where known: the entry a pod's
    # running processes read, which a tenant can rename (or hide past the count).
    _entries: dict[Key, dict[str, int]] = field(default_factory=dict)
    _adopted_at: dict[Key, float] = field(default_factory=dict)  # first read, this daemon

    def __post_init__(self) -> None:
        self._file = PrivateFile(self.folder, LIMITS_FILE)
        if self.folder.is_dir():
            self._held, self._entries = _decode(self._file.load(), self._file.path)

    def _gpus(self, key: Key, identity: Identity) -> dict[str, DeviceLimits] | None:
        """A copy of the limits held for the pod's region file ``identity``; None when none are
        (a new pod, or its file made anew)."""
        known = self._held.get(key)
        return dict(known[1]) if known is not None and known[0] == identity else None

    def wrote(self, key: Key, identity: Identity, written: Mapping[str, DeviceLimits]) -> None:
        """The daemon wrote these limits (by GPU UUID) into the pod's region."""
        by_gpu = self._gpus(key, identity) or {}
        by_gpu.update({uuid.lower(): limits for uuid, limits in written.items()})
        self._change(key, (identity, by_gpu))

    def merge_base(
        self, key: Key, identity: Identity, uuid: str
    ) -> Callable[[DeviceLimits], DeviceLimits]:
        """What a change of one GPU's limits is merged over, from the words its region has:
        those words, or the limits held where they raise past them. Before, an admin's change
        of one limit kept the others as the region had them, and a tenant that kept its words
        raised had its raise written, and held, by the admin's next change of anything."""
        held = (self._gpus(key, identity) or {}).get(uuid.lower())
        return lambda words: held if held is not None and raises(words, held) else words

    def holds(self, key: Key, identity: Identity) -> bool:
        """Whether limits are held for the pod's region file ``identity`` (kept from its first
        read, or its making, until the pod is deleted or gone)."""
        return self._gpus(key, identity) is not None

    def held_gpus(self, key: Key, identity: Identity) -> set[str] | None:
        """The GPUs (UUIDs in lower case) the pod is on: those its limits are held on; None
        while any GPU the region lists is the pod's (a pod first read, or adopted less than
        ADOPTING_S ago)."""
        by_gpu = self._gpus(key, identity)
        adopted = self._adopted_at.get(key)
        if by_gpu is None or (adopted is not None and time.monotonic() - adopted < ADOPTING_S):
            return None
        return set(by_gpu)

    def entries(self, key: Key, identity: Identity) -> dict[str, int]:
        """The entry (index) of each held GPU of the pod's region file ``identity`` that is
        known (by UUID, lower case)."""
        if self._gpus(key, identity) is None:
            return {}
        return dict(self._entries.get(key, {}))

    def forget(self, key: Key) -> None:
        self._adopted_at.pop(key, None)
        self._entries.pop(key, None)
        if key in self._held:
            del self._held[key]
            self._save()

    def keep_only(self, present: Iterable[Key]) -> None:
        """Forget the pods gone (not unreadable ones: the caller names every pod it found)."""
        gone = set(self._held) - set(present)
        for key in gone:
            del self._held[key]
            self._adopted_at.pop(key, None)
            self._entries.pop(key, None)
        if gone:
            self._save()

    def bound(
        self, key: Key, identity: Identity, devices: Iterable[DeviceInfo]
    ) -> dict[str, DeviceLimits]:
        """The held limits of the devices whose words raise past them, by GPU UUID (lower
        case); words of a pod or a GPU not held yet are adopted (first read)."""
        held_before = self._gpus(key, identity)
        by_gpu = held_before or {}
        adopted = held_before is None
        if adopted:
            self._adopted_at[key] = time.monotonic()
            self._entries.pop(key, None)  # a new pod, or its file made anew
        entries = self._entries.setdefault(key, {})
        learned = False
        raised: dict[str, DeviceLimits] = {}
        for device in devices:
            uuid = device.uuid.lower()
            held = by_gpu.get(uuid)
            if uuid not in entries and (held is not None or adopted):
                entries[uuid] = device.index
                learned = True
            if held is None:
                by_gpu[uuid] = device.limits
                adopted = True
            elif raises(device.limits, held):
                raised[uuid] = held
                if (key, uuid) not in self._said:
                    self._said.add((key, uuid))
                    log.warning(
                        "pod %s/%s: GPU %s: limits raised in its region (memory %d, compute %d, "
                        "burst %d, flags %d) past the ones the daemon holds: set back",
                        *key,
                        device.uuid,
                        device.memory_limit,
                        device.compute_limit,
                        device.compute_soft_limit,
                        device.device_flags,
                    )
            else:
                self._said.discard((key, uuid))
        if adopted:
            self._change(key, (identity, by_gpu))
        if learned:
            self._save()
        return raised

    def _change(self, key: Key, value: tuple[Identity, dict[str, DeviceLimits]]) -> None:
        if self._held.get(key) != value:
            self._held[key] = value
            self._save()

    def _save(self) -> None:
        if self._file is not None:
            self._file.save(_encode(self._held, self._entries))


# {base}/.daemon/limits.json: [{"namespace", "name", "region": [st_dev, st_ino],
#                               "gpus": {uuid: [memory, compute, soft, flags]},
#                               "entries": {uuid: index}}]  (entries: where known)


def _encode(
    held: Mapping[Key, tuple[Identity, Mapping[str, DeviceLimits]]],
    entries: Mapping[Key, Mapping[str, int]],
) -> list[Any]:
    return [
        {
            "namespace": ns,
            "name": name,
            "region": list(identity),
            "gpus": {
                uuid: [w.memory_limit, w.compute_limit, w.compute_soft_limit, w.device_flags]
                for uuid, w in sorted(by_gpu.items())
            },
            "entries": dict(sorted(entries.get((ns, name), {}).items())),
        }
        for (ns, name), (identity, by_gpu) in sorted(held.items())
    ]


def _word(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError("a limit that is not a whole number of 0 or more")
    return value


def _decode(
    document: Any, path: Path
) -> tuple[dict[Key, tuple[Identity, dict[str, DeviceLimits]]], dict[Key, dict[str, int]]]:
    """The limits a file holds, and the entries where known; none from one that is not a list
    of such entries (said). A file of a daemon before entries were kept has none."""
    held: dict[Key, tuple[Identity, dict[str, DeviceLimits]]] = {}
    entries: dict[Key, dict[str, int]] = {}
    if document is None:
        return held, entries
    try:
        for key, identity, entry in pod_entries(document):
            by_gpu: dict[str, DeviceLimits] = {}
            for uuid, words in entry["gpus"].items():
                memory, compute, soft, flags = (_word(v) for v in words)
                by_gpu[str(uuid).lower()] = DeviceLimits(memory, compute, soft, flags)
            held[key] = (identity, by_gpu)
            indexes = {str(u).lower(): _word(i) for u, i in entry.get("entries", {}).items()}
            entries[key] = {u: i for u, i in indexes.items() if u in by_gpu and i < MAX_DEVICES}
    except (TypeError, KeyError, ValueError, AttributeError) as error:
        log.warning("%s: cannot read: %s; starting afresh", path, error)
        return {}, {}
    return held, entries
