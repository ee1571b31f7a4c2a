"""tf-limiter coverage against the simulated driver, and against drivers with a new entry point."""

import json
import subprocess
import sys
from pathlib import Path

from vgpu_limiter import library_path, sim
from vgpu_limiter.coverage import FAMILIES, base_name, family_of

TF_LIMITER = str(Path(sys.executable).with_name("tf-limiter"))


def coverage(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TF_LIMITER, "coverage", *arguments], capture_output=True, text=True, check=False
    )


def driver_exporting(folder: Path, *symbols: str) -> Path:
    """A shared object that exports the given functions, as a driver would."""
    source = folder / "driver.c"
    source.write_text("".join(f"void {name}(void) {{}}\n" for name in symbols))
    library = folder / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library


def test_the_simulated_driver_is_fully_covered() -> None:
    folder = sim.library_dir()
    cuda, nvml = str(folder / "libcuda.so.1"), str(folder / "libnvidia-ml.so.1")
    result = coverage("--cuda", cuda, "--nvml", nvml, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["gaps"] == []
    entries = report["cuda"]["entry_points"]
    # Every family is present in the simulator, so the test would see a family go missing.
    assert {e["family"] for e in entries.values()} == {*FAMILIES, None}
    assert entries["cuMemAlloc"]["handled"] == ["cuMemAlloc", "cuMemAlloc_v2"]
    assert "cuMemAllocAsync_ptsz" in entries["cuMemAllocAsync"]["handled"]
    assert report["nvml"]["entry_points"]["nvmlDeviceGetMemoryInfo"]["family"] == "memory info"
    text = coverage("--cuda", cuda, "--nvml", nvml)
    assert text.returncode == 0
    assert "every entry point of the limit-carrying families is intercepted" in text.stdout


def test_a_new_allocation_variant_fails_the_report(tmp_path: Path) -> None:
    driver = driver_exporting(
        tmp_path, "cuMemAlloc_v2", "cuMemAlloc_v3", "cuLaunchKernel", "cuMemcpy", "cuCtxCreate_v9"
    )
    result = coverage("--cuda", str(driver), "--nvml", str(driver))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "GAP allocation  cuMemAlloc" in result.stdout
    last = result.stdout.splitlines()[-1]
    assert last.endswith("not intercepted: cuCtxCreate_v9, cuMemAlloc_v3")
    # A function outside the families (a copy) is listed but does not fail the report.
    report = json.loads(coverage("--cuda", str(driver), "--nvml", str(driver), "--json").stdout)
    assert report["cuda"]["entry_points"]["cuMemcpy"] == {
        "family": None,
        "handled": [],
        "unhandled": ["cuMemcpy"],
    }


# What driver 580.159.04 exported that the limiter did not intercept before (docs/release.md).
DRIVER_580_GAPS = [
    "cuLaunch",
    "cuLaunchGrid",
    "cuLaunchGridAsync",
    "cuLaunchCooperativeKernelMultiDevice",
    "cuMemGetInfo",
    "cuDeviceTotalMem",
    "cuCtxDestroy",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxReset",
    "cuGreenCtxCreate",
    "cuGreenCtxDestroy",
]


def test_the_legacy_and_green_context_entry_points_are_intercepted(tmp_path: Path) -> None:
    driver = driver_exporting(tmp_path, *DRIVER_580_GAPS)
    result = coverage("--cuda", str(driver), "--nvml", str(driver), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    entries = json.loads(result.stdout)["cuda"]["entry_points"]
    for name in DRIVER_580_GAPS:
        entry = entries[base_name(name)]
        assert entry["family"] is not None, name
        assert name in entry["handled"], name


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notelf.so").write_text("not a library")
    for arguments, message in (
        (["--cuda", str(tmp_path / "missing.so")], "--cuda"),
        (["--cuda", str(tmp_path / "notelf.so")], "not an ELF file"),
        (["--limiter", str(tmp_path / "missing.so")], "--limiter"),
    ):
        result = coverage(*arguments, "--nvml", str(sim.library_dir() / "libnvidia-ml.so.1"))
        assert result.returncode == 2, (arguments, result.stderr)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1


def test_variants_fold_to_the_name_cuGetProcAddress_takes() -> None:
    assert base_name("cuMemcpy2DAsync_v2_ptsz") == "cuMemcpy2DAsync"
    assert base_name("cuLaunchKernel_ptsz") == "cuLaunchKernel"
    assert base_name("nvmlDeviceGetMemoryInfo_v2") == "nvmlDeviceGetMemoryInfo"
    assert family_of("cuMemAllocHost") is None  # host memory carries no limit
    assert family_of("cuLaunchHostFunc") is None
    assert family_of("cuGraphInstantiateWithParams") == "graph"


def test_the_report_runs_with_the_standard_library_alone() -> None:
    # As on a GPU node with nothing installed: python3 -S (no site-packages), sources on the path.
    packages = Path(__file__).resolve().parents[2] / "packages"
    folder = sim.library_dir()
    result = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "vgpu_limiter.coverage_report",
            "--cuda",
            str(folder / "libcuda.so.1"),
            "--nvml",
            str(folder / "libnvidia-ml.so.1"),
            "--limiter",
            str(library_path()),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": f"{packages / 'limiter' / 'src'}:{packages / 'common' / 'src'}"},
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout
        == coverage(
            "--cuda", str(folder / "libcuda.so.1"), "--nvml", str(folder / "libnvidia-ml.so.1")
        ).stdout
    )
