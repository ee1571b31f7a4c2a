"""The pods the daemon deleted while their workers still charged their region file, by the
identity of that file: kept across its restarts in ``{base}/.daemon/deleted.json``
(identity_book.py).

A deleted pod's file stays, marked deleted, until its last worker exits; the mark is a flag its
own processes can write. The daemon sets again a mark they clear. Before, it remembered these
pods in memory alone: a tenant that cleared the mark while no daemon ran (a restart, an upgrade)
had its pod, with the limits and class it wrote meanwhile, adopted as a new pod's by the next
daemon."""

from collections.abc import Mapping
from typing import Any, Final

from vgpu_hypervisor.daemon.identity_book import Identity, IdentityBook, Key

DELETED_FILE: Final = "deleted.json"


class DeletedPods(IdentityBook[bool]):
    FILE = DELETED_FILE

    def deleted(self, key: Key, identity: Identity) -> bool:
        """Whether the daemon deleted the pod whose region file is ``identity``."""
        return self._found(key, identity) is not None

    def hold(self, key: Key, identity: Identity) -> None:
        self._put(key, identity, True)

    def _fields(self, value: bool) -> Mapping[str, Any]:
        return {}

    def _value(self, entry: Mapping[str, Any]) -> bool:
        return True
