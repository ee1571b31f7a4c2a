"""The functions a shared object exports, read from its ELF dynamic symbol table.

Small on purpose: the coverage report runs on GPU nodes where only the limiter's own
dependencies are installed, and it needs nothing but defined function names from .dynsym.
"""

import struct
from pathlib import Path

_SHT_DYNSYM = 11
_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_STB_GLOBAL = 1
_STB_WEAK = 2


class ElfError(ValueError):
    """The file is not an ELF shared object this reader understands."""


def exported_functions(path: Path) -> set[str]:
    """Names of the functions ``path`` defines and exports (global or weak, any version)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ElfError(f"{path}: {error.strerror}") from error
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    if data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ElfError(f"{path}: unknown ELF class or byte order")
    is64 = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    try:
        return _functions(data, is64, order)
    except (struct.error, IndexError, UnicodeDecodeError) as error:
        raise ElfError(f"{path}: truncated or malformed ELF ({error})") from error


def _functions(data: bytes, is64: bool, order: str) -> set[str]:
    if is64:
        shoff, shentsize, shnum = _unpack(order + "40xQ10xHH", data, 0)
    else:
        shoff, shentsize, shnum = _unpack(order + "32xI10xHH", data, 0)
    # Section header: name, type, flags, addr, offset, size, link, info, align, entsize.
    header = order + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
    sections = [struct.unpack_from(header, data, shoff + i * shentsize) for i in range(shnum)]
    dynsym = next((s for s in sections if s[1] == _SHT_DYNSYM), None)
    if dynsym is None:
        raise ElfError("no dynamic symbol table (.dynsym)")
    strtab = sections[dynsym[6]]
    strings = data[strtab[4] : strtab[4] + strtab[5]]
    entry = order + ("IBBHQQ" if is64 else "IIIBBH")
    size = struct.calcsize(entry)
    names: set[str] = set()
    for offset in range(dynsym[4] + size, dynsym[4] + dynsym[5], size):  # entry 0 is null
        if is64:
            name, info, _, shndx, _, _ = struct.unpack_from(entry, data, offset)
        else:
            name, _, _, info, _, shndx = struct.unpack_from(entry, data, offset)
        if shndx == 0 or info >> 4 not in (_STB_GLOBAL, _STB_WEAK):
            continue
        if info & 0xF not in (_STT_FUNC, _STT_GNU_IFUNC):
            continue
        end = strings.index(b"\0", name)
        names.add(strings[name:end].decode())
    return names


def _unpack(layout: str, data: bytes, offset: int) -> tuple[int, ...]:
    return tuple(struct.unpack_from(layout, data, offset))
