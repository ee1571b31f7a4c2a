"""vgpu-sim-workload on the simulated driver through the three paths programs reach it by."""

import subprocess
from pathlib import Path

import pytest
from vgpu_limiter import sim

from tests.sim.conftest import SimEnv
from tests.sim.workload_runner import CONTEXT_OVERHEAD, GiB, MiB, python, succeed, workload
from tests.support.elf import dynamic_entries, undefined_symbols

PATHS = ["linked", "dlopen", "procaddress"]


@pytest.mark.parametrize("path", PATHS)
def test_each_path_allocates_and_runs_the_kernels(sim_env: SimEnv, path: str) -> None:
    report = succeed(
        sim_env(),
        *("--path", path, "--alloc", "1.5GiB", "--kernels", "25", "--kernel-us", "2000"),
        *("--streams", "2", "--batch", "4"),
    )
    assert report["path"] == path
    assert report["kernels"] == 25
    assert report["allocated_bytes"] == 3 * GiB // 2
    assert report["total_bytes"] == 80 * GiB
    assert report["free_bytes"] == 80 * GiB - CONTEXT_OVERHEAD - 3 * GiB // 2
    assert report["device_name"] == "NVIDIA H100 80GB HBM3"
    assert report["driver_version"] == 13000
    assert report["gpu_time_s"] >= 0.05 * 0.999


def test_the_workload_is_linked_against_the_driver() -> None:
    program = sim.workload_path()
    assert "libcuda.so.1" in dynamic_entries(program, "NEEDED")
    # The linked path needs the ABI names from the dynamic linker, the others dlopen + dlsym.
    assert {"cuMemAlloc_v2", "cuLaunchKernel", "dlopen", "dlsym"} <= undefined_symbols(program)


SHIM = """
#include <stddef.h>
int cuMemAlloc_v2(unsigned long long *dptr, size_t bytes) {
    (void)dptr; (void)bytes;
    return 800; /* CUDA_ERROR_NOT_PERMITTED */
}
"""


@pytest.fixture(scope="module")
def refusing_interposer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An LD_PRELOAD library whose cuMemAlloc_v2 always fails."""
    folder = tmp_path_factory.mktemp("shim")
    (folder / "shim.c").write_text(SHIM)
    library = folder / "libshim.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(library), str(folder / "shim.c")],
        check=True,
        capture_output=True,
    )
    return library


@pytest.mark.parametrize(("path", "intercepted"), [(p, p == "linked") for p in PATHS])
def test_only_the_linked_path_goes_through_an_interposer(
    sim_env: SimEnv, refusing_interposer: Path, path: str, intercepted: bool
) -> None:
    # dlsym on the driver's handle and cuGetProcAddress_v2 bypass a preloaded symbol: that is
    # why the limiter must also interpose dlsym and cuGetProcAddress (design: three paths).
    environment = sim_env(LD_PRELOAD=str(refusing_interposer))
    report = workload(environment, "--path", path, "--alloc", "1MiB", "--kernels", "1")
    if intercepted:
        assert report["error"] == "CUDA_ERROR_NOT_PERMITTED in cuMemAlloc_v2"
        assert report["returncode"] == 1
    else:
        assert "error" not in report, report
        assert report["allocated_bytes"] == MiB


def test_procaddress_asks_for_the_requested_version(sim_env: SimEnv) -> None:
    # Graphs came with CUDA 10.0: an older runtime cannot get them.
    old = workload(sim_env(), "--path", "procaddress", "--cuda-version", "9020", "--graph")
    assert old["error"].startswith("CUDA_ERROR_NOT_FOUND in cuGetProcAddress_v2(cu")
    assert "VERSION_NOT_SUFFICIENT" in old["detail"]
    # Without --graph the same version suffices, and the other paths ignore the option.
    assert succeed(sim_env(), "--path", "procaddress", "--cuda-version", "11040")["kernels"] == 10
    assert succeed(sim_env(), "--path", "dlopen", "--cuda-version", "11000", "--graph")["graph"]


PROCADDRESS_PROBE = """
import ctypes, json, os
driver = ctypes.CDLL(os.environ["TF_CUDA_LIB_PATH"])
get = driver.cuGetProcAddress_v2
get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
results = []
for base, version, flags in CASES:
    address, status = ctypes.c_void_p(), ctypes.c_int(-1)
    result = get(base.encode(), ctypes.byref(address), version, flags, ctypes.byref(status))
    found = None
    if address.value:
        names = [n for n in SYMBOLS if ctypes.cast(getattr(driver, n), ctypes.c_void_p).value
                 == address.value]
        found = names[0] if names else "?"
    results.append([result, status.value, found])
print(json.dumps(results))
"""

PER_THREAD = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
# (base name, cudaVersion, flags) → (CUresult, symbol status, ABI symbol returned)
PROCADDRESS_CASES: list[tuple[tuple[str, int, int], tuple[int, int, str | None]]] = [
    (("cuMemAlloc", 13000, 0), (0, 0, "cuMemAlloc_v2")),
    (("cuCtxSynchronize", 12090, 0), (0, 0, "cuCtxSynchronize")),
    (("cuCtxSynchronize", 13000, 0), (0, 0, "cuCtxSynchronize_v2")),
    (("cuMemAlloc", 3010, 0), (0, 0, "cuMemAlloc")),  # the legacy 32-bit entry point
    (("cuCtxCreate", 11030, 0), (0, 0, "cuCtxCreate_v2")),
    (("cuCtxCreate", 12000, 0), (0, 0, "cuCtxCreate_v3")),
    (("cuCtxCreate", 13000, 0), (0, 0, "cuCtxCreate_v4")),
    (("cuGraphInstantiate", 12000, 0), (0, 0, "cuGraphInstantiateWithFlags")),
    (("cuLaunchKernel", 13000, 0), (0, 0, "cuLaunchKernel")),
    (("cuLaunchKernel", 13000, PER_THREAD), (0, 0, "cuLaunchKernel_ptsz")),
    (("cuStreamBeginCapture", 13000, PER_THREAD), (0, 0, "cuStreamBeginCapture_v2_ptsz")),
    (("cuMemAllocAsync", 11000, 0), (500, 2, None)),  # NOT_FOUND, VERSION_NOT_SUFFICIENT
    (("cuNoSuchEntryPoint", 13000, 0), (500, 1, None)),  # NOT_FOUND, SYMBOL_NOT_FOUND
]


def test_get_proc_address_picks_the_symbol_for_version_and_stream(sim_env: SimEnv) -> None:
    cases = [case for case, _ in PROCADDRESS_CASES]
    symbols = sorted({symbol for _, (_, _, symbol) in PROCADDRESS_CASES if symbol})
    results = python(sim_env(), f"CASES = {cases!r}\nSYMBOLS = {symbols!r}\n{PROCADDRESS_PROBE}")
    for (case, expected), result in zip(PROCADDRESS_CASES, results, strict=True):
        assert (case, result) == (case, list(expected))


@pytest.mark.parametrize("mode", ["capture", "build"])
def test_graph_rounds_report_the_kernels(sim_env: SimEnv, mode: str) -> None:
    report = succeed(sim_env(), f"--graph={mode}", "--kernels", "30", "--kernel-us", "100")
    assert (report["graph"], report["graph_mode"], report["kernels"]) == (True, mode, 30)


def test_capture_on_the_legacy_stream_is_refused(sim_env: SimEnv) -> None:
    report = workload(sim_env(), "--streams", "0", "--graph")
    assert report["error"] == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED in cuStreamBeginCapture_v2"


def test_legacy_default_stream(sim_env: SimEnv) -> None:
    report = succeed(sim_env(), "--streams", "0", "--kernels", "7", "--kernel-us", "1000")
    assert (report["streams"], report["kernels"]) == (0, 7)
    assert report["gpu_time_s"] >= 0.007 * 0.999


def test_second_device(sim_env: SimEnv, tmp_path: Path) -> None:
    report = succeed(sim_env("count=1;count=1,memory=8GiB,name=Small GPU"), "--device", "1")
    assert (report["device"], report["device_name"]) == (1, "Small GPU")
    assert report["total_bytes"] == 8 * GiB
    # The devices are fixed when the node's state is created: a one-device node needs its own.
    one_device = sim_env("1", VGPU_SIM_STATE=str(tmp_path / "one.state"))
    missing = workload(one_device, "--device", "1")
    assert missing["error"] == "CUDA_ERROR_INVALID_DEVICE in cuDeviceGet"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--path", "ctypes"], "--path ctypes: expected linked, dlopen or procaddress"),
        (["--kernels", "many"], "--kernels many: expected a whole number"),
        (["--kernels"], "--kernels: expected a value"),
        (["--alloc", "4 parsecs"], "--alloc 4 parsecs: expected a size"),
        (["--kernel-us", "-1"], "--kernel-us -1: expected a number"),
        (["--kernel-us", "nan"], "--kernel-us nan: expected a number"),
        (["--streams", "65"], "--streams 65: expected a whole number from 0 to 64"),
        (["--graph=replay"], "--graph=replay: expected capture or build"),
        (["--kernels", "5", "--duration", "1"], "--kernels and --duration exclude each other"),
        (["--graph", "--kernels", "15"], "--graph: --kernels 15 is not a multiple of --batch 10"),
        (["--frobnicate"], "--frobnicate: unknown option"),
        (["leftover"], "leftover: unexpected argument"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    sim_env: SimEnv, args: list[str], message: str
) -> None:
    result = subprocess.run(
        [str(sim.workload_path()), *args],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"vgpu-sim-workload: error: {message}")
    assert result.stderr.count("\n") == 1


def test_help_lists_the_options(sim_env: SimEnv) -> None:
    result = subprocess.run(
        [str(sim.workload_path()), "--help"],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    for option in ["--path", "--alloc", "--kernels", "--duration", "--graph", "--hold"]:
        assert option in result.stdout
