"""Running programs as a tenant: another, unprivileged user (`nobody`, uid 65534), which needs
root to become. The limiter, the simulated GPU and its workload are copied into a folder every
user can read first, so that these tests do not depend on where the checkout lives (a clone
under a 0700 folder is not readable by another user)."""

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from vgpu_limiter import library_path, sim

NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as a second, unprivileged user needs root"
)


@dataclass(frozen=True)
class TenantTools:
    """Copies of the programs a tenant runs, under ``root`` (mode 0755, everyone's to read)."""

    root: Path

    @property
    def workload(self) -> Path:
        return self.root / "bin" / sim.workload_path().name

    def environment(self, environment: Mapping[str, str]) -> dict[str, str]:
        """``environment`` with the copies in place of the checkout's programs."""
        library = self.root / "lib"
        changed = dict(environment)
        changed["LD_LIBRARY_PATH"] = str(library)
        changed["TF_CUDA_LIB_PATH"] = str(library / "libcuda.so.1")
        changed["TF_NVML_LIB_PATH"] = str(library / "libnvidia-ml.so.1")
        if "LD_PRELOAD" in changed:
            changed["LD_PRELOAD"] = str(self.root / library_path().name)
        return changed

    def run_as_tenant(
        self,
        command: list[str],
        environment: Mapping[str, str],
        groups: Sequence[int] = (),
        user: int = NOBODY,
        **options: object,
    ) -> "subprocess.Popen[str]":
        """``command`` as ``user`` (its group the same number), with ``groups`` as its only
        supplementary groups."""
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            command,
            env=self.environment(environment),
            user=user,
            group=user,
            extra_groups=list(groups),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **options,
        )


@contextmanager
def readable_folder(prefix: str = "vgpu-") -> Iterator[Path]:
    """A new folder (removed afterwards, whatever another user left in it) that every user can
    reach: pytest's own folders are private to their user."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


@contextmanager
def tenant_tools() -> Iterator[TenantTools]:
    """A readable folder (removed afterwards) with the copies; also a place for the test's own
    files that the tenant must reach (``root / "node"``)."""
    with readable_folder("vgpu-tenant-") as top:
        shutil.copytree(sim.library_dir(), top / "lib")
        (top / "bin").mkdir()
        shutil.copy2(sim.workload_path(), top / "bin")
        shutil.copy2(library_path(), top)
        (top / "node").mkdir(mode=0o755)
        yield TenantTools(top)
