"""build_support/native_check.py passes a clean library and names each broken rule."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("elftools")  # the release group's checker dependency

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "build_support"))
from native_check import problems


def build(folder: Path, name: str, source: str, *flags: str) -> Path:
    (folder / f"{name}.c").write_text(source)
    output = folder / f"{name}.so"
    command = ["cc", "-shared", "-fPIC", str(folder / f"{name}.c"), "-o", str(output), *flags]
    subprocess.run(command, check=True)
    return output


def test_a_plain_library_passes(tmp_path: Path) -> None:
    library = build(
        tmp_path, "plain", "#include <string.h>\nsize_t f(const char *s) { return strlen(s); }\n"
    )
    assert problems(library, "x86_64") == []
    assert problems(library, "aarch64") == ["built for EM_X86_64, not aarch64"]


def test_each_rule_is_checked(tmp_path: Path) -> None:
    source = """
#include <sys/random.h>
extern void PyErr_Clear(void);
long f(void *buffer) { PyErr_Clear(); return getrandom(buffer, 1, 0); }
"""
    library = build(
        tmp_path,
        "broken",
        source,
        "-Wl,-rpath,/opt/lib",
        "-Wl,--no-as-needed",
        "-lm",
        "-Wl,--unresolved-symbols=ignore-all",
    )
    found = problems(library, "x86_64")
    assert any(p.startswith("NEEDED libm.so.6") for p in found), found
    assert any(p.startswith(("RPATH /opt/lib", "RUNPATH /opt/lib")) for p in found), found
    assert "needs GLIBC_2.25 (newer than GLIBC_2.17)" in " ".join(found), found
    assert "references Python symbol PyErr_Clear" in found, found


def test_not_an_elf_file(tmp_path: Path) -> None:
    (tmp_path / "text.so").write_text("hello")
    assert problems(tmp_path / "text.so", "x86_64")[0].startswith("cannot read as ELF")
