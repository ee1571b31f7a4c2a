"""Locating libadd_path.so and calling its merge rule through cffi (ABI mode).

ABI mode (``ffi.dlopen``) keeps the library a plain shared object with no Python symbols, so
the same file is preloaded into non-Python processes. Loading it here runs its constructor,
which applies any TF_* variables to this process's C-level environment, exactly as a preload
would; ``os.environ`` is not refreshed by that.
"""

import os
from functools import cache
from pathlib import Path
from typing import Any

# The variables the library rewrites, with the characters that split their entries
# (ld.so accepts spaces as well as colons in LD_PRELOAD).
SEPARATORS: dict[str, str] = {"PATH": ":", "LD_PRELOAD": ": ", "LD_LIBRARY_PATH": ":"}

_CDEF = """
char *vgpu_add_path_merge(const char *current, const char *prepend, const char *append,
                          const char *separators);
void vgpu_add_path_free(char *value);
"""


def library_path() -> Path:
    """Absolute path of the installed libadd_path.so."""
    path = Path(__file__).resolve().with_name("libadd_path.so")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the vgpu-add-path build did not produce it")
    return path


@cache
def _native() -> tuple[Any, Any]:
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(_CDEF)
    return ffi, ffi.dlopen(str(library_path()))


def merge(
    current: str | None, prepend: str | None, append: str | None, separators: str = ":"
) -> str | None:
    """The library's merge rule for one variable: the new value, or None to leave it as it is.

    Entries of ``prepend`` go in front and entries of ``append`` at the end, each only if it is
    not empty and not already present; ``current`` is kept verbatim.
    """
    ffi, lib = _native()

    def encode(text: str | None) -> Any:
        return ffi.NULL if text is None else os.fsencode(text)

    result = lib.vgpu_add_path_merge(
        encode(current), encode(prepend), encode(append), os.fsencode(separators)
    )
    if result == ffi.NULL:
        return None
    try:
        return os.fsdecode(ffi.string(result))
    finally:
        lib.vgpu_add_path_free(result)
