"""Choosing and starting the GPU backend: the NVIDIA driver's NVML, or the simulated GPU.

pynvml loads one libnvidia-ml per process. We load it ourselves (ctypes, by soname or path) and
hand it to pynvml (``pynvml.nvmlLib``) before nvmlInit, then ask the dynamic linker which file
it is: the simulated library counts as "simulated" however it was found (LD_LIBRARY_PATH too).
The simulated library maps its node state (VGPU_SIM_STATE) once per process, at the first init.
"""

import dataclasses
import os
from pathlib import Path

from vgpu_limiter import sim

from . import nvml
from .snapshot import BackendKind, PlainData
from .stderr import CapturedStderr
from .values import Value

_SIM_PREFIX = "vgpu simulated GPU: "  # how the simulated library reports a problem on stderr


@dataclasses.dataclass
class _SimulatedLibrary:
    """This process's simulated NVML: the node state it mapped, or why it could not (the library
    maps its state once per process and never retries)."""

    state: Path | None = None
    failure: str | None = None


_simulated = _SimulatedLibrary()


class GpuBackendError(Exception):
    """The GPU backend cannot start, or is used after it stopped; the message is one line."""


@dataclasses.dataclass(frozen=True, slots=True)
class BackendInfo(PlainData):
    """The backend in use, for the daemon's first log line and its API.

    ``reason`` says why this backend was chosen; ``sim_state`` is the simulated node's state file
    (None on a real driver); ``library`` the libnvidia-ml file loaded.
    """

    backend: BackendKind
    reason: str
    library: str
    device_count: int
    driver_version: Value[str]
    nvml_version: Value[str]
    cuda_version: Value[str]
    sim_state: str | None

    def describe(self) -> str:
        """One line, e.g. "GPU backend: simulated GPU (requested): 2 devices, driver ..."."""
        what = "simulated GPU" if self.backend == "simulated" else "NVIDIA driver"
        plural = "" if self.device_count == 1 else "s"
        parts = [
            f"{self.device_count} device{plural}",
            f"driver {self.driver_version}",
            f"CUDA {self.cuda_version}",
        ]
        if self.sim_state is not None:
            parts.append(f"node state {self.sim_state}")
        parts.append(f"library {self.library}")
        return f"GPU backend: {what} ({self.reason}): {', '.join(parts)}"


class _NoDriver(Exception):
    """No NVIDIA driver: its library is missing or its kernel module is not loaded."""


def simulated_library() -> Path:
    """The simulated libnvidia-ml.so.1 shipped with vgpu-limiter."""
    try:
        return sim.library_dir() / nvml.SONAME
    except FileNotFoundError as error:
        raise GpuBackendError(str(error)) from None


def default_sim_state() -> Path:
    """The node state the simulated GPU uses when none is given (as the simulator decides)."""
    configured = os.environ.get("VGPU_SIM_STATE")
    if configured:
        return Path(configured).absolute()
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"vgpu-sim-{os.getuid()}.state"


def _is_simulated(library: Path) -> bool:
    try:
        folder = sim.library_dir().resolve()
    except FileNotFoundError:
        return False
    return library.resolve().parent == folder


def start(
    *, simulate: bool | None = None, sim_state: Path | None = None, library: Path | None = None
) -> BackendInfo:
    """Initialize NVML and say which backend answers.

    ``simulate``: True uses the simulated GPU; None (auto) the NVIDIA driver, or the simulated
    GPU where there is none; False only the driver. ``library``: an explicit libnvidia-ml file
    (e.g. TF_NVML_LIB_PATH) instead of the soname. ``sim_state``: the simulated node's state file
    (None: VGPU_SIM_STATE or the simulator's default); workloads must use the same one.
    Raises GpuBackendError (one line) when no backend can start.
    """
    with nvml.LOCK:
        if simulate:
            return _start(str(simulated_library()), sim_state, "requested")
        if library is not None:
            try:
                return _start(str(library), sim_state, f"library {library} given")
            except _NoDriver as missing:
                raise GpuBackendError(f"NVML ({library}): {missing}") from None
        try:
            info = _start(nvml.SONAME, sim_state, f"{nvml.SONAME} found")
        except _NoDriver as missing:
            if simulate is False:
                raise GpuBackendError(f"no NVIDIA driver: {missing}") from None
            return _start(str(simulated_library()), sim_state, f"no NVIDIA driver: {missing}")
        if simulate is False and info.backend == "simulated":
            nvml.shutdown()  # found first on the library path, but the driver was asked for
            raise GpuBackendError(
                f"no NVIDIA driver: {nvml.SONAME} is the simulated GPU's ({info.library})"
            )
        return info


def stop() -> None:
    """Shut NVML down (once per start)."""
    with nvml.LOCK:
        nvml.shutdown()


def _load(name: str) -> Path:
    """Have pynvml use the library ``name``; its file. Reuses the library already in use."""
    in_use = nvml.loaded_library() if nvml.nvml_users() else None
    if in_use is not None:
        wanted = None if name == nvml.SONAME else Path(name).resolve()
        if wanted is not None and wanted != in_use:
            raise GpuBackendError(f"NVML already runs on {in_use} in this process, not {wanted}")
        return in_use
    try:
        return nvml.load_library(name)
    except RuntimeError as error:  # in use, by a library that cannot be identified
        raise GpuBackendError(str(error)) from None
    except OSError as error:
        if name == nvml.SONAME:
            raise _NoDriver(f"{name} not found") from None
        raise GpuBackendError(f"cannot load {name}: {error}") from None


def _start(name: str, sim_state: Path | None, reason: str) -> BackendInfo:
    library = _load(name)
    state: Path | None = None
    if _is_simulated(library):
        state = _initialize_simulated(sim_state)
    else:
        try:
            nvml.initialize()
        except nvml.NVMLError as error:
            if nvml.error_code(error) in (nvml.DRIVER_NOT_LOADED, nvml.LIBRARY_NOT_FOUND):
                raise _NoDriver(str(error)) from None
            raise GpuBackendError(f"NVML ({library}): nvmlInit failed: {error}") from None
    try:
        count = nvml.device_count()
    except nvml.NVMLError as error:
        nvml.shutdown()
        raise GpuBackendError(f"NVML ({library}): cannot count devices: {error}") from None
    return BackendInfo(
        backend="simulated" if state is not None else "nvml",
        reason=reason,
        library=str(library),
        device_count=count,
        driver_version=nvml.driver_version(),
        nvml_version=nvml.nvml_version(),
        cuda_version=nvml.cuda_version(),
        sim_state=None if state is None else str(state),
    )


def _initialize_simulated(sim_state: Path | None) -> Path:
    """nvmlInit of the simulated library on the node state ``sim_state``; the state's path."""
    state = Path(sim_state).absolute() if sim_state is not None else default_sim_state()
    bound = _simulated.state
    if bound is not None and state != bound:
        raise GpuBackendError(f"this process's simulated GPU already uses {bound}, not {state}")
    if sim_state is not None:
        os.environ["VGPU_SIM_STATE"] = str(state)  # read by the library at its first init
    captured = CapturedStderr()
    try:
        with captured:
            nvml.initialize()
    except nvml.NVMLError as error:
        said = [
            line.removeprefix(_SIM_PREFIX).strip()
            for line in captured.text.splitlines()
            if line.startswith(_SIM_PREFIX)
        ]
        captured.replay(skip=_SIM_PREFIX)
        _simulated.failure = (
            said[-1] if said else _simulated.failure or f"VGPU_SIM_STATE={state}: {error}"
        )
        raise GpuBackendError(f"simulated GPU: {_simulated.failure}") from None
    captured.replay()
    _simulated.state = state
    return state
