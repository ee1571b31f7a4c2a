"""The optional parts of vgpu-hypervisor and what they need installed.

A bare-metal node runs the daemon without gRPC or a Kubernetes client: they come with the
`kubernetes` extra (`pip install 'vgpu-hypervisor[kubernetes]'`), which the pod source
(`--kubernetes`) and the device plugin (`--device-plugin`) need."""

import importlib.util
from typing import Final

KUBERNETES_EXTRA: Final = "vgpu-hypervisor[kubernetes]"
# The top-level modules the extra brings, as imported.
KUBERNETES_MODULES: Final = ("lightkube", "grpc", "google.protobuf")


class ExtraMissing(Exception):
    """A part asked for whose extra is not installed; the message says what to install."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):  # a parent package (google) missing, or blocked
        return False


def require_kubernetes(asked_by: str) -> None:
    """ExtraMissing naming ``asked_by`` (the flag) when the kubernetes extra is missing."""
    missing = [module for module in KUBERNETES_MODULES if not _installed(module)]
    if missing:
        raise ExtraMissing(
            f"{asked_by} needs the kubernetes extra ({', '.join(missing)} not installed): "
            f"pip install '{KUBERNETES_EXTRA}'"
        )
