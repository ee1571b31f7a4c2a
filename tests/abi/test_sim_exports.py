"""The simulated driver exports exactly the entry points of the table (no more, no fewer), as
a plain shared object built with -Bsymbolic."""

from vgpu_limiter import sim

from tests.support import elf
from tests.support.cuda_table import cuda_entries


def test_simulated_driver_exports_the_table() -> None:
    library = sim.library_dir() / "libcuda.so.1"
    assert elf.exported_symbols(library) == {entry.symbol for entry in cuda_entries()}


def test_simulated_libraries_bind_their_own_symbols() -> None:
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        library = sim.library_dir() / name
        assert elf.dynamic_entries(library, "SONAME") == [name]
        assert elf.dynamic_entries(library, "RPATH") == []
        flags = elf.dynamic_flags(library)
        assert "SYMBOLIC" in flags, f"{name} must be linked with -Bsymbolic"
