"""libcuda_limiter.so: per-pod GPU memory and compute limits for unmodified CUDA programs."""

from pathlib import Path


def library_path() -> Path:
    """Absolute path of the installed libcuda_limiter.so."""
    path = Path(__file__).resolve().with_name("libcuda_limiter.so")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the vgpu-limiter build did not produce it")
    return path


__all__ = ["library_path"]
