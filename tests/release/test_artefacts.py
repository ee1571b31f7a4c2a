"""The release's native files on both architectures, arm64 under qemu-user: add-path's behaviour,
the limiter loading under LD_BIND_NOW=1, and its memory limits on that architecture's build of
the simulated GPU.

The files come from ``nox -s release`` (the unpacked manylinux wheels, VGPU_RELEASE_DIR); without
them these tests skip, inside that session they must run.
"""

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cuda_table import INCLUDE

ROOT = Path(__file__).resolve().parents[2]
RELEASE = Path(os.environ.get("VGPU_RELEASE_DIR", ROOT / "build" / "release"))
DIST = Path(os.environ.get("VGPU_RELEASE_DIST", ROOT / "dist" / "release"))
C_TESTS = ROOT / "tests" / "c"
ADD_PATH = ROOT / "packages" / "add_path" / "csrc"
GiB, MiB = 1 << 30, 1 << 20
# Variables that steer the dynamic loader: under qemu-user they belong to the guest, not qemu.
LOADER_VARIABLES = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_BIND_NOW")


@dataclass(frozen=True)
class Arch:
    name: str
    short: str  # vgpu.rs's name: x64, arm64
    compiler: str
    emulator: tuple[str, ...]  # prefix that runs its programs here; empty when native

    @property
    def site(self) -> Path:
        return RELEASE / self.name / "site"

    def program(self, folder: Path, name: str, *sources: Path, link: Sequence[str] = ()) -> Path:
        """Compile a C test program for this architecture."""
        output = folder / name
        subprocess.run(
            [
                self.compiler,
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                *map(str, sources),
                "-o",
                str(output),
                *link,
            ],
            check=True,
        )
        return output

    def run(
        self, command: Sequence[str], environment: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        host = {k: v for k, v in environment.items() if k not in LOADER_VARIABLES}
        prefix: list[str] = list(self.emulator)
        if self.emulator:
            for name in LOADER_VARIABLES:
                if name in environment:
                    prefix += ["-E", f"{name}={environment[name]}"]
        else:
            host = environment
        return subprocess.run(
            [*prefix, *command],
            env=host,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def _arch(name: str, short: str, compiler: str, emulator: tuple[str, ...]) -> Arch:
    arch = Arch(name, short, compiler, emulator)
    missing = [tool for tool in (compiler, *emulator[:1]) if shutil.which(tool) is None]
    if not (arch.site / "vgpu_limiter").is_dir():
        missing.append(f"{arch.site} (nox -s release builds it)")
    if missing:
        if os.environ.get("VGPU_RELEASE_DIR"):
            pytest.fail(f"{name}: missing {', '.join(missing)}")
        pytest.skip(f"{name}: missing {', '.join(missing)}")
    return arch


@pytest.fixture(params=["x86_64", "aarch64"])
def arch(request: pytest.FixtureRequest) -> Arch:
    if request.param == "x86_64":
        return _arch("x86_64", "x64", "cc", ())
    return _arch(
        "aarch64",
        "arm64",
        "aarch64-linux-gnu-gcc",
        ("qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"),
    )


def base_environment() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C"}


def test_add_path_merge_and_rewrite(arch: Arch, tmp_path: Path) -> None:
    program = arch.program(
        tmp_path,
        "add_path_test",
        C_TESTS / "add_path_test.c",
        ADD_PATH / "add_path.c",
        link=[f"-I{ADD_PATH}"],
    )
    result = arch.run([str(program)], base_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith(" 0 failed"), result.stdout


def test_add_path_library_rewrites_a_program_s_environment(arch: Arch, tmp_path: Path) -> None:
    program = arch.program(tmp_path, "print_env", Path(__file__).with_name("print_env.c"))
    library = arch.site / "vgpu_add_path" / "libadd_path.so"
    environment = base_environment() | {
        "LD_PRELOAD": str(library),
        "LD_BIND_NOW": "1",
        "TF_PREPEND_PATH": "/opt/a",
        "TF_PATH": "/opt/b",
        "TF_LD_LIBRARY_PATH": "/opt/lib",
    }
    result = arch.run([str(program), "PATH", "LD_LIBRARY_PATH"], environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "PATH=/opt/a:/usr/bin:/bin:/opt/b",
        "LD_LIBRARY_PATH=/opt/lib",
    ]
    assert result.stderr == ""


def limited(arch: Arch, tmp_path: Path, memory: str | None, **extra: str) -> dict[str, str]:
    sim = arch.site / "vgpu_limiter" / "sim" / "lib"
    environment = base_environment() | {
        "LD_PRELOAD": str(arch.site / "vgpu_limiter" / "libcuda_limiter.so"),
        "LD_BIND_NOW": "1",
        "LD_LIBRARY_PATH": str(sim),
        "TF_CUDA_LIB_PATH": str(sim / "libcuda.so.1"),
        "TF_NVML_LIB_PATH": str(sim / "libnvidia-ml.so.1"),
        "VGPU_SIM_STATE": str(tmp_path / "node.state"),
        "SHM_PATH": str(tmp_path / "pod"),
        "TF_CUDA_CONTEXT_OVERHEAD": "512MiB",
    }
    if memory is not None:
        environment["TENSOR_FUSION_CUDA_MEM_LIMIT"] = memory
    return environment | extra


def workload(arch: Arch, environment: dict[str, str], *options: str) -> dict[str, object]:
    binary = arch.site / "vgpu_limiter" / "sim" / "bin" / "vgpu-sim-workload"
    result = arch.run([str(binary), "--kernels", "1", *options], environment)
    assert result.stdout, result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    return report


def test_limiter_loads_with_every_symbol_bound(arch: Arch, tmp_path: Path) -> None:
    # LD_BIND_NOW=1 resolves every symbol at load: a program without CUDA, then one with it.
    program = arch.program(tmp_path, "print_env", Path(__file__).with_name("print_env.c"))
    environment = limited(arch, tmp_path, None)
    result = arch.run([str(program), "LD_BIND_NOW"], environment)
    assert (result.returncode, result.stdout, result.stderr) == (0, "LD_BIND_NOW=1\n", "")
    report = workload(arch, environment, "--alloc", "1GiB")
    assert report.get("error") is None, report
    assert report["total_bytes"] == 80 * GiB


@pytest.mark.parametrize("path", ["linked", "dlopen", "procaddress"])
def test_memory_limit_is_exact_at_the_boundary(arch: Arch, tmp_path: Path, path: str) -> None:
    environment = limited(arch, tmp_path, '{"0": "4GiB"}')
    fits = workload(arch, environment, "--path", path, "--alloc", str(4 * GiB - 512 * MiB))
    assert fits.get("error") is None, fits
    assert (fits["total_bytes"], fits["free_bytes"]) == (4 * GiB, 0)
    over = workload(arch, environment, "--path", path, "--alloc", str(4 * GiB - 512 * MiB + 1))
    assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"


@pytest.mark.parametrize("path", ["linked", "dlopen", "procaddress"])
def test_every_allocation_api_is_charged_refused_and_given_back(
    arch: Arch, tmp_path: Path, path: str
) -> None:
    sim = arch.site / "vgpu_limiter" / "sim" / "lib"
    program = arch.program(
        tmp_path,
        "limiter_paths",
        C_TESTS / "limiter_paths.c",
        link=[f"-I{INCLUDE}", f"-L{sim}", "-l:libcuda.so.1", "-lpthread"],
    )
    environment = limited(arch, tmp_path, '{"0": "1GiB"}', TF_CUDA_CONTEXT_OVERHEAD="256MiB")
    result = arch.run([str(program), path], environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("passed, 0 failed")


def test_tarballs_install_as_vgpu_rs_documents(arch: Arch, tmp_path: Path) -> None:
    # tar -xzf libadd_path-${ARCH}.tar.gz; tar -xzf libcuda_limiter-${ARCH}.tar.gz; check; use.
    for name in ("libadd_path", "libcuda_limiter"):
        tarball = DIST / f"{name}-{arch.short}.tar.gz"
        subprocess.run(["tar", "-xzf", str(tarball)], cwd=tmp_path, check=True)
        subprocess.run(
            ["sha256sum", "--quiet", "-c", f"SHA256SUMS.{name}"], cwd=tmp_path, check=True
        )
        assert (tmp_path / f"README.{name}").read_text().startswith(f"{name}.so ({arch.name})")
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".so") == [
        "libadd_path.so",
        "libcuda_limiter.so",
    ]
    environment = limited(arch, tmp_path, '{"0": "2GiB"}')
    environment["LD_PRELOAD"] = f"{tmp_path / 'libadd_path.so'}:{tmp_path / 'libcuda_limiter.so'}"
    report = workload(arch, environment | {"TF_PATH": "/opt/b"}, "--alloc", "1GiB")
    assert (report.get("error"), report["total_bytes"]) == (None, 2 * GiB)
    sums = (DIST / "SHA256SUMS").read_text()
    assert f"  {name}-{arch.short}.tar.gz\n" in sums
