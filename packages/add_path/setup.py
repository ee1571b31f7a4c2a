import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vgpu_build import NativeLibrary, setup_package

setup_package(
    __file__,
    requires=["cffi>=1.16", "typer>=0.12"],
    siblings=["vgpu-common"],
    native=[NativeLibrary("vgpu_add_path.libadd_path", sources=["csrc/add_path.c"])],
)
