"""The pods the daemon deleted while their workers ran are remembered across its restarts
(``{base}/.daemon/deleted.json``); a damaged file is said and holds none."""

import json
import logging
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon.deleted_pods import DELETED_FILE, DeletedPods
from vgpu_hypervisor.daemon.pods import POLICY_FOLDER

from tests.hypervisor.conftest import Said


def test_the_deleted_pods_read_back_as_written(tmp_path: Path) -> None:
    folder = tmp_path / POLICY_FOLDER
    written = DeletedPods(folder)
    written.hold(("default", "gone"), (1, 2))
    written.hold(("team", "going"), (3, 4))
    read = DeletedPods(folder)
    assert read.deleted(("default", "gone"), (1, 2))
    assert read.deleted(("team", "going"), (3, 4))
    assert not read.deleted(("team", "going"), (3, 5))  # another file of the name
    assert not read.deleted(("team", "other"), (3, 4))
    read.keep_only([("team", "going")])
    read.forget(("team", "going"))
    again = DeletedPods(folder)
    assert not again.deleted(("default", "gone"), (1, 2))
    assert not again.deleted(("team", "going"), (3, 4))


@pytest.mark.parametrize(
    "document",
    [
        {"namespace": "default"},
        7,
        [{"namespace": "default", "name": "gone"}],
        [{"namespace": "default", "name": "gone", "region": [1, True]}],
        [{"namespace": "default", "name": "gone", "region": [1]}],
        [{"namespace": 1, "name": "gone", "region": [1, 2]}],
    ],
)
def test_a_damaged_deleted_file_is_said_and_holds_none(tmp_path: Path, document: object) -> None:
    folder = tmp_path / POLICY_FOLDER
    folder.mkdir(mode=0o700)
    (folder / DELETED_FILE).write_text(json.dumps(document))
    said = Said()
    logging.getLogger("vgpu_hypervisor").addHandler(said)
    try:
        held = DeletedPods(folder)
    finally:
        logging.getLogger("vgpu_hypervisor").removeHandler(said)
    assert not held.deleted(("default", "gone"), (1, 2))
    assert any(f"{DELETED_FILE}: cannot read" in line for line in said.lines)
