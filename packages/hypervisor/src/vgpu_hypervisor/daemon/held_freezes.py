"""The freezes the daemon holds, by pod: the GPUs each one holds (None: every GPU of the pod),
with the identity of the region file it was made on.

A freeze is a flag and a deadline in the pod's region, which the pod's own processes can write:
the daemon renews the deadline at every pass and makes again a freeze they cleared or narrowed.
What it holds is kept across its restarts in ``{base}/.daemon/freezes.json``
(identity_book.py). Before, it was held in memory alone: a process of the pod that cleared the
flag while no daemon ran (a restart, an upgrade) ran on after the next daemon started, read as
not frozen, until an admin froze it again. A freeze that ran out while no daemon renewed it
(10 s) is made again too: it ends at a resume, not when the daemon stops."""

from collections.abc import Iterable, Mapping
from typing import Any, Final

from vgpu_hypervisor.daemon.identity_book import Identity, IdentityBook, Key

FREEZES_FILE: Final = "freezes.json"

Gpus = frozenset[str | None]  # the frozen GPUs' UUIDs as the admin named them; None: all


class HeldFreezes(IdentityBook[Gpus]):
    """``{"gpus": [uuid or null, ...]}`` past each entry's pod and region."""

    FILE = FREEZES_FILE

    def gpus(self, key: Key, identity: Identity) -> Gpus | None:
        """The GPUs of the pod's freeze on region file ``identity``; None when it has none."""
        return self._found(key, identity)

    def hold(self, key: Key, identity: Identity, gpus: Iterable[str | None]) -> None:
        self._put(key, identity, frozenset(gpus))

    def _fields(self, value: Gpus) -> Mapping[str, Any]:
        return {"gpus": sorted(value, key=lambda gpu: (gpu is not None, gpu or ""))}

    def _value(self, entry: Mapping[str, Any]) -> Gpus:
        gpus = entry["gpus"]
        if not isinstance(gpus, list) or not gpus:
            raise TypeError("a freeze of no GPUs")
        if not all(gpu is None or isinstance(gpu, str) for gpu in gpus):
            raise TypeError("a GPU that is not a UUID or null")
        return frozenset(gpus)
