"""Our own CUDA driver declarations agree with NVIDIA's cuda.h: every signature in the entry
point table, the layout of every struct we declare, and the value of every constant."""

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cuda_table import INCLUDE, cuda_entries, official_include

# (type, fields) whose offsets must agree; a type marked as a prefix skips its total size.
STRUCTS: list[tuple[str, list[str], bool]] = [
    ("CUuuid", ["bytes"], False),
    ("CUctxCreateParams", ["execAffinityParams", "numExecAffinityParams", "cigParams"], False),
    ("CUlaunchAttribute", ["id", "value"], False),
    (
        "CUlaunchConfig",
        ["gridDimX", "blockDimZ", "sharedMemBytes", "hStream", "attrs", "numAttrs"],
        False,
    ),
    (
        "CUDA_LAUNCH_PARAMS",
        ["function", "gridDimZ", "blockDimZ", "sharedMemBytes", "hStream", "kernelParams"],
        False,
    ),
    ("CUDA_KERNEL_NODE_PARAMS_v1", ["func", "sharedMemBytes", "kernelParams", "extra"], False),
    ("CUDA_KERNEL_NODE_PARAMS_v2", ["func", "kernelParams", "extra", "kern", "ctx"], False),
    ("CUmemLocation", ["type", "id"], False),
    (
        "CUmemAllocationProp",
        ["type", "requestedHandleTypes", "location", "win32HandleMetaData", "allocFlags"],
        False,
    ),
    ("CUmemAccessDesc", ["location", "flags"], False),
    (
        "CUmemPoolProps",
        ["allocType", "handleTypes", "location", "maxSize", "usage", "reserved"],
        False,
    ),
    (
        "CUDA_MEM_ALLOC_NODE_PARAMS",
        ["poolProps", "accessDescs", "accessDescCount", "bytesize", "dptr"],
        False,
    ),
    (
        "CUDA_GRAPH_INSTANTIATE_PARAMS",
        ["flags", "hUploadStream", "hErrNode_out", "result_out"],
        False,
    ),
    ("CUDA_ARRAY_DESCRIPTOR", ["Width", "Height", "Format", "NumChannels"], False),
    (
        "CUDA_ARRAY3D_DESCRIPTOR",
        ["Width", "Height", "Depth", "Format", "NumChannels", "Flags"],
        False,
    ),
]


def _constants() -> list[str]:
    abi = (INCLUDE / "cuda_abi.h").read_text()
    names = re.findall(r"^\s+X\((CUDA_\w+),", abi, re.MULTILINE)
    names += re.findall(r"^\s+(CU_\w+) = ", abi, re.MULTILINE)
    names += re.findall(r"^#define (CU_(?:EVENT|STREAM)_\w+) ", abi, re.MULTILINE)
    return names


def _layout_program(include: str) -> str:
    lines = [include, "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    for name, fields, prefix in STRUCTS:
        if not prefix:
            lines.append(f'    printf("sizeof {name} %zu\\n", sizeof({name}));')
        for field in fields:
            lines.append(f'    printf("{name}.{field} %zu\\n", offsetof({name}, {field}));')
    for constant in _constants():
        lines.append(f'    printf("{constant} %lld\\n", (long long)({constant}));')
    lines += ["    return 0;", "}"]
    return "\n".join(lines)


def _run_program(source: str, include_dir: Path, tmp_path: Path, name: str) -> list[str]:
    program = tmp_path / name
    (tmp_path / f"{name}.c").write_text(source)
    subprocess.run(
        ["cc", "-std=c11", "-w", f"-I{include_dir}", f"{program}.c", "-o", str(program)],
        check=True,
    )
    return subprocess.run([program], check=True, capture_output=True, text=True).stdout.splitlines()


@pytest.fixture(scope="module")
def cuda_include() -> Path:
    return official_include("cuda.h")


def test_every_entry_point_signature_matches(cuda_include: Path, tmp_path: Path) -> None:
    entries = cuda_entries()
    assert len(entries) > 100
    # The official header declares older versioned symbols under __CUDA_API_VERSION_INTERNAL.
    checks = [
        f"_Static_assert(__builtin_types_compatible_p(__typeof__(&{e.symbol}), "
        f'CUresult (*){e.params}), "{e.symbol}");'
        for e in entries
    ]
    source = tmp_path / "signatures.c"
    source.write_text(
        "#define __CUDA_API_VERSION_INTERNAL 1\n#include <cuda.h>\n" + "\n".join(checks)
    )
    result = subprocess.run(
        ["cc", "-std=c11", "-fsyntax-only", f"-I{cuda_include}", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_struct_layouts_and_constants_match(cuda_include: Path, tmp_path: Path) -> None:
    ours = _run_program(_layout_program('#include "cuda_abi.h"'), INCLUDE, tmp_path, "ours")
    official = _run_program(
        _layout_program("#include <cuda.h>"), cuda_include, tmp_path, "official"
    )
    assert len(ours) > 150
    assert ours == official


def test_table_has_unique_symbols_and_known_stream_kinds() -> None:
    entries = cuda_entries()
    symbols = [e.symbol for e in entries]
    assert len(symbols) == len(set(symbols))
    assert {e.stream for e in entries} == {"LEGACY", "PTSZ"}
    for entry in entries:
        if entry.stream == "PTSZ":
            assert entry.symbol.endswith(("_ptsz", "_ptds"))
