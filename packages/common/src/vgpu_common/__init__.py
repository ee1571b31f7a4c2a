"""Pure-Python pieces shared by the vgpu packages."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vgpu-common")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
