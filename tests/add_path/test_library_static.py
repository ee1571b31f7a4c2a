"""The built libadd_path.so is a plain shared object fit for any process on glibc ≥ 2.17."""

from pathlib import Path

from tests.support import elf


def test_no_python_symbols(libadd_path: Path) -> None:
    python = {name for name in elf.undefined_symbols(libadd_path) if name.startswith(("Py", "_Py"))}
    assert python == set()


def test_needs_only_libc_and_has_no_rpath(libadd_path: Path) -> None:
    assert elf.dynamic_entries(libadd_path, "NEEDED") == ["libc.so.6"]
    assert elf.dynamic_entries(libadd_path, "RPATH") == []
    assert elf.dynamic_entries(libadd_path, "RUNPATH") == []


def test_glibc_symbol_versions_at_most_2_17(libadd_path: Path) -> None:
    assert (2, 2) <= elf.newest_glibc_version(libadd_path) <= (2, 17)


def test_exports_only_its_api(libadd_path: Path) -> None:
    assert elf.exported_symbols(libadd_path) == {
        "vgpu_add_path_merge",
        "vgpu_add_path_free",
        "vgpu_add_path_apply",
    }
