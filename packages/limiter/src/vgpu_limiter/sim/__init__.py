"""The simulated GPU: a CUDA driver (libcuda.so.1) and NVML (libnvidia-ml.so.1) in C that share
one node-wide state file, so programs, the limiter and the daemon can run without a GPU."""

import os
from collections.abc import Mapping
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def library_dir() -> Path:
    """The folder holding the simulated libcuda.so.1 and libnvidia-ml.so.1."""
    folder = _HERE / "lib"
    if not (folder / "libcuda.so.1").is_file() or not (folder / "libnvidia-ml.so.1").is_file():
        raise FileNotFoundError(f"{folder}: the simulated GPU libraries were not built")
    return folder


def workload_path() -> Path:
    """The simulator's workload program (vgpu-sim-workload)."""
    path = _HERE / "bin" / "vgpu-sim-workload"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the simulator workload was not built")
    return path


def state_path(environ: Mapping[str, str]) -> Path:
    """The state file the simulated libraries use in ``environ``: VGPU_SIM_STATE, else the
    libraries' own default, $TMPDIR/vgpu-sim-UID.state (sim_state.c)."""
    configured = environ.get("VGPU_SIM_STATE")
    if configured:
        return Path(configured)
    return Path(environ.get("TMPDIR") or "/tmp") / f"vgpu-sim-{os.getuid()}.state"


def environment(
    devices: str | None = None,
    state: str | os.PathLike[str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Variables that make a program (and pynvml) use the simulated GPU.

    ``devices`` is a VGPU_SIM_DEVICES value; ``state`` the node-wide state file (VGPU_SIM_STATE);
    ``base`` the environment the result extends (default: this process's).
    """
    base = os.environ if base is None else base
    folder = library_dir()
    existing = base.get("LD_LIBRARY_PATH", "")
    changes = {
        "LD_LIBRARY_PATH": f"{folder}:{existing}" if existing else str(folder),
        "TF_CUDA_LIB_PATH": str(folder / "libcuda.so.1"),
        "TF_NVML_LIB_PATH": str(folder / "libnvidia-ml.so.1"),
    }
    if devices is not None:
        changes["VGPU_SIM_DEVICES"] = devices
    if state is not None:
        changes["VGPU_SIM_STATE"] = str(state)
    return changes
