"""The claims this node prepared, kept across the daemon's restarts: a restarted daemon answers
the kubelet's Prepare of a claim it prepared as before, and its Unprepare removes what was made.

In the daemon's own folder under the base path ({base}/.daemon/dra-claims.json, see
daemon/private_file.py): no container mounts it, no tenant can write it. Each claim is kept as
it was allocated when prepared, with the owner its pod's region was given.
"""

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from vgpu_hypervisor.daemon.pods import POLICY_FOLDER
from vgpu_hypervisor.daemon.private_file import PrivateFile
from vgpu_hypervisor.dra.claims import Claim, Share
from vgpu_hypervisor.kubernetes.model import UserGroup

log = logging.getLogger("vgpu_hypervisor.dra")
FILE: Final = "dra-claims.json"
VERSION: Final = 1


@dataclass(frozen=True)
class Prepared:
    claim: Claim
    owner: UserGroup


class Checkpoint:
    """The prepared claims by UID; ``save`` after each change."""

    def __init__(self, base: Path) -> None:
        self._file = PrivateFile(base / POLICY_FOLDER, FILE)
        self.claims: dict[str, Prepared] = _decode(self._file.load())

    def save(self) -> None:
        self._file.save(
            {
                "version": VERSION,
                "claims": {uid: asdict(one) for uid, one in self.claims.items()},
            }
        )


def _decode(document: Any) -> dict[str, Prepared]:
    if document is None:
        return {}
    try:
        if document["version"] != VERSION:
            raise ValueError(f"version {document['version']}")
        claims = {}
        for uid, one in document["claims"].items():
            claim = dict(one["claim"])
            claim["shares"] = tuple(Share(**share) for share in claim["shares"])
            claim["parameters"] = tuple(
                (tuple(requests), parameters) for requests, parameters in claim["parameters"]
            )
            claims[uid] = Prepared(Claim(**claim), UserGroup(**one["owner"]))
        return claims
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        log.warning("%s: unreadable (%s): starting with no prepared claim", FILE, error)
        return {}
