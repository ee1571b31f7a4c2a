"""tf-hypervisor: the vgpu node daemon and its command-line client."""

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The installed version; "unknown" when run from a source tree that is not installed."""
    try:
        return version("vgpu-hypervisor")
    except PackageNotFoundError:
        return "unknown"
