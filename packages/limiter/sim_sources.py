"""The simulated GPU's C sources, listed once: the package build links them into the simulated
libcuda.so.1 and libnvidia-ml.so.1, and the sanitizer session compiles the driver's with its
own test. Paths are relative to the folder given (the vgpu-limiter package)."""

from pathlib import Path

# The node-wide state and the parsers both simulated libraries share.
SHARED = [
    "csrc/sim/sim_state.c",
    "csrc/sim/sim_config.c",
    "csrc/common/vgpu_parse.c",
    "csrc/common/vgpu_proc.c",
    "csrc/common/vgpu_files.c",
    "csrc/common/vgpu_cuda_sizes.c",
    "csrc/common/vgpu_cuda_table.c",
    "csrc/common/vgpu_table.c",
]


def _sources(package: Path, pattern: str) -> list[Path]:
    return [*sorted(package.glob(pattern)), *(package / name for name in SHARED)]


def driver_sources(package: Path) -> list[Path]:
    """The simulated CUDA driver (libcuda.so.1)."""
    return _sources(package, "csrc/sim/cuda_*.c")


def nvml_sources(package: Path) -> list[Path]:
    """The simulated NVML (libnvidia-ml.so.1)."""
    return _sources(package, "csrc/sim/nvml_*.c")
