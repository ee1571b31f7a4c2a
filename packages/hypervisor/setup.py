import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vgpu_build import setup_package

setup_package(
    __file__,
    requires=[
        "typer>=0.12",
        "rich>=13",
        "pydantic-settings>=2.4",
        "nvidia-ml-py>=12.560",
        "psutil>=5.9",
        "fastapi>=0.115",
        # The API subclasses uvicorn's h11 protocol, a private class (daemon/api/connections.py):
        # raise the bound after checking a new release against it.
        "uvicorn>=0.30,<0.55",
        "prometheus-client>=0.20",
        "httpx>=0.27",  # the CLI's client of the daemon's API
        "pyyaml>=6.0",  # -o yaml
    ],
    # The pod source and the device plugin (vgpu_hypervisor/extras.py): not on bare metal.
    extras={"kubernetes": ["lightkube>=1.0", "grpcio>=1.85", "protobuf>=7.35"]},
    siblings=["vgpu-common", "vgpu-limiter"],
)
