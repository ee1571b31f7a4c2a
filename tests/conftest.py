import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from vgpu_add_path import library_path
from vgpu_hypervisor.gpu import GpuObserver, NodeSnapshot


@pytest.fixture(scope="session")
def libadd_path() -> Path:
    return library_path()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: less than one region."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


# Session-wide and here, for every test package: a process binds the simulated GPU to one
# state file for its life (the device plugin's and the DRA driver's tests share it).
@pytest.fixture(scope="session")
def sim_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("node") / "node.state"


@pytest.fixture(scope="session")
def snapshot(sim_state: Path) -> NodeSnapshot:
    """One sample of the simulated node (two GPUs)."""
    saved = os.environ.pop("VGPU_SIM_DEVICES", None)
    try:
        with GpuObserver.open(simulate=True, sim_state=sim_state) as observer:
            return observer.sample()
    finally:
        if saved is not None:
            os.environ["VGPU_SIM_DEVICES"] = saved
