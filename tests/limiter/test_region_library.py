"""libvgpu_region.so: the region protocol alone, loadable by the daemon without the interposer."""

import os
import re
import subprocess
import sys
from pathlib import Path

from vgpu_limiter import region as regions

from tests.support import elf

API = Path(__file__).resolve().parents[2] / "packages/limiter/csrc/include/vgpu_region_api.h"


def test_it_exports_exactly_the_header_functions() -> None:
    declared = set(re.findall(r"VGPU_REGION_API [\w ]+? \*?(vgpu_\w+)\(", API.read_text()))
    assert len(declared) >= 10
    assert elf.exported_symbols(regions.LIBRARY_PATH) == declared
    # Python declares nothing itself: every prototype comes from the preprocessed header.
    cdef = regions.CDEF_PATH.read_text()
    assert all(f"{name}(" in cdef for name in declared)
    assert re.findall(r"\.cdef\((.*)\)", Path(regions.__file__).read_text()) == ["declarations"]


def test_it_is_a_plain_library_of_the_c_library_alone() -> None:
    """libc, and libpthread for the lease arbiter's thread (its home before glibc 2.34)."""
    library = regions.LIBRARY_PATH
    assert {n for n in elf.undefined_symbols(library) if n.startswith(("Py", "_Py"))} == set()
    assert "dlsym" not in elf.exported_symbols(library)
    assert elf.dynamic_entries(library, "NEEDED") == ["libpthread.so.0", "libc.so.6"]
    assert elf.dynamic_entries(library, "RPATH") == elf.dynamic_entries(library, "RUNPATH") == []
    assert elf.newest_glibc_version(library) <= (2, 17)
    # Every symbol resolves at load time: nothing of Python's, nothing of the interposer's.
    loaded = subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(library)!r})"],
        env={**os.environ, "LD_BIND_NOW": "1"},
        check=False,
    )
    assert loaded.returncode == 0
