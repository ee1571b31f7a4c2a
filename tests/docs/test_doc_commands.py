"""The commands the README and docs/ show as runnable, run as written.

A fenced block whose info string is ``sh runnable`` is run by bash from the checkout's root in
a shell set up as the README says (``source scripts/shell.sh``), against a daemon on the
simulated GPU whose address, token and base path are in the environment (as run.sh prints
them); ``sh runnable gpu`` blocks need a real GPU and are skipped here. Blocks are quick: they
are documentation first.
"""

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hypervisor.conftest import Daemon, clean_environment

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```sh runnable( gpu)?\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, bool, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", bool(match[1]), match[2]))
    return found


BLOCKS = _blocks()


def test_the_docs_have_runnable_blocks() -> None:
    # The marker is what keeps the docs honest: losing every block would pass silently.
    assert len(BLOCKS) >= 4, BLOCKS


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path_factory.mktemp("node"))
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()


@pytest.mark.parametrize(("where", "gpu", "script"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_doc_block_runs(node: Daemon, tmp_path: Path, where: str, gpu: bool, script: str) -> None:
    if gpu:
        pytest.skip("needs a real NVIDIA GPU")
    environment = clean_environment()
    # A new shell: the environment's commands are not on PATH until shell.sh puts them there.
    bin_dir = str(Path(sys.executable).parent)
    environment["PATH"] = os.pathsep.join(
        part for part in environment.get("PATH", os.defpath).split(os.pathsep) if part != bin_dir
    )
    environment |= {
        "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),
        "TMPDIR": str(tmp_path),
        "API_LISTEN_ADDR": f"127.0.0.1:{node.port}",
        "TF_HYPERVISOR_TOKEN_FILE": str(node.token_file),
        "SHM_BASE_PATH": str(node.base),
        "VGPU_SIM_STATE": str(node.state),
        "VGPU_SIM_DEVICES": "2",
    }
    result = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\nsource scripts/shell.sh\n{script}"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, (
        f"{where}:\n{script}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
