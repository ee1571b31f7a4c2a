"""tf-limiter sim env | run | workload, through the installed entry point."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from vgpu_limiter import sim

TF_LIMITER = str(Path(sys.executable).with_name("tf-limiter"))
# No simulator variables: what the programs see comes from the command alone.
CLEAN = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
DEVICES = "name=CLI GPU,memory=2GiB"


def tf_limiter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TF_LIMITER, *args], env=CLEAN, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def state(tmp_path: Path) -> Path:
    # A name that needs quoting in a shell.
    return tmp_path / "node's state"


def test_env_prints_quoted_exports(state: Path) -> None:
    result = tf_limiter("sim", "env", "--devices", DEVICES, "--state", str(state))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(line.startswith("export ") for line in lines)
    values = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines)
    assert values["VGPU_SIM_DEVICES"] == DEVICES
    assert values["VGPU_SIM_STATE"] == str(state)
    assert values["LD_LIBRARY_PATH"] == str(sim.library_dir())
    assert values["TF_CUDA_LIB_PATH"] == str(sim.library_dir() / "libcuda.so.1")


def test_env_can_be_evaluated_by_sh(state: Path) -> None:
    script = (
        f'eval "$({shlex.quote(TF_LIMITER)} sim env --devices {shlex.quote(DEVICES)} '
        f'--state {shlex.quote(str(state))})" && exec {shlex.quote(str(sim.workload_path()))} '
        "--alloc 1GiB --kernels 2"
    )
    result = subprocess.run(
        ["sh", "-c", script], env=CLEAN, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["device_name"], report["total_bytes"]) == ("CLI GPU", 2 << 30)
    assert state.is_file()


def test_env_keeps_an_existing_library_path(state: Path) -> None:
    result = subprocess.run(
        [TF_LIMITER, "sim", "env", "--state", str(state)],
        env=CLEAN | {"LD_LIBRARY_PATH": "/opt/mine"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"export LD_LIBRARY_PATH={sim.library_dir()}:/opt/mine\n" in result.stdout


def test_run_puts_python_and_nvml_on_the_simulated_gpu(state: Path) -> None:
    probe = (
        "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h))"
    )
    result = tf_limiter(
        "sim", "run", "--devices", f"count=3,{DEVICES}", "--state", str(state), "--",
        sys.executable, "-c", probe,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "3 CLI GPU\n"


def test_lose_gpu_fails_every_nvml_query_of_the_device_until_it_is_back(state: Path) -> None:
    probe = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "for i in range(pynvml.nvmlDeviceGetCount()):\n"
        "    h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
        "    try:\n"
        "        total = pynvml.nvmlDeviceGetMemoryInfo(h).total\n"
        "        print(i, total, pynvml.nvmlDeviceGetUUID(h)[:4])\n"
        "    except pynvml.NVMLError as error:\n"
        "        print(i, type(error).__name__)\n"
    )
    run = ("sim", "run", "--devices", f"count=2,{DEVICES}", "--state", str(state), "--")
    assert (
        tf_limiter(*run, sys.executable, "-c", probe).stdout
        == "0 2147483648 GPU-\n1 2147483648 GPU-\n"
    )

    lost = tf_limiter("sim", "lose-gpu", "1", "--state", str(state))
    assert (lost.returncode, lost.stdout) == (0, "device 1 fell off the bus\n"), lost.stderr
    seen = tf_limiter(*run, sys.executable, "-c", probe).stdout
    assert seen == "0 2147483648 GPU-\n1 NVMLError_GpuIsLost\n"

    back = tf_limiter("sim", "lose-gpu", "1", "--back", "--state", str(state))
    assert (back.returncode, back.stdout) == (0, "device 1 is back\n"), back.stderr
    assert tf_limiter(*run, sys.executable, "-c", probe).stdout.endswith("1 2147483648 GPU-\n")


@pytest.mark.parametrize("args", [["7"], ["-1"]])
def test_lose_gpu_of_no_such_device_is_one_line(state: Path, args: list[str]) -> None:
    made = tf_limiter("sim", "workload", "--state", str(state), "--kernels", "1")
    assert made.returncode == 0, made.stderr
    result = tf_limiter("sim", "lose-gpu", "--state", str(state), "--", *args)
    assert (result.returncode, result.stderr) == (
        2,
        f"error: {state}: no simulated device {args[0]}\n",
    )


def test_lose_gpu_needs_a_node(state: Path) -> None:
    result = tf_limiter("sim", "lose-gpu", "0", "--state", str(state))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {state}: no simulated node there")


def test_run_passes_options_and_exit_status_through(state: Path) -> None:
    result = tf_limiter(
        "sim", "run", "--state", str(state), "--", "sh", "-c", "echo $1; exit 3", "sh", "--state"
    )
    assert (result.returncode, result.stdout) == (3, "--state\n")


@pytest.mark.parametrize(
    ("command", "code", "message"),
    [
        ("no-such-program-vgpu", 127, "error: no-such-program-vgpu: command not found\n"),
        ("/nonexistent/program", 127, "error: /nonexistent/program: no such file\n"),
        ("{data}", 126, "error: cannot run {data}: Permission denied\n"),
    ],
)
def test_run_failures_are_one_line(tmp_path: Path, command: str, code: int, message: str) -> None:
    data = tmp_path / "data.txt"
    data.write_text("not a program\n")
    data.chmod(0o644)
    result = tf_limiter("sim", "run", "--", command.format(data=data))
    assert (result.returncode, result.stderr, result.stdout) == (
        code,
        message.format(data=data),
        "",
    )


def test_workload_passes_its_options_through(state: Path) -> None:
    result = tf_limiter(
        "sim", "workload", "--path", "procaddress", "--devices", DEVICES, "--kernels", "3",
        "--state", str(state), "--alloc", "1GiB", "--device", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["path"], report["kernels"], report["allocated_bytes"]) == (
        "procaddress", 3, 1 << 30,
    )  # fmt: skip
    assert (report["device_name"], report["total_bytes"]) == ("CLI GPU", 2 << 30)


def test_workload_reports_cuda_errors_with_its_exit_status(state: Path) -> None:
    result = tf_limiter(
        "sim", "workload", "--devices", DEVICES, "--state", str(state), "--alloc", "2GiB"
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"] == "CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc_v2"


def test_workload_help_after_double_dash() -> None:
    result = tf_limiter("sim", "workload", "--", "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: vgpu-sim-workload")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sim", "workload", "--kernels", "lots"], "vgpu-sim-workload: error: --kernels lots"),
        (["sim", "workload", "--", "--devices", "1"], "vgpu-sim-workload: error: --devices"),
    ],
)
def test_bad_workload_options_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = tf_limiter(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["sim", "env", "--bogus"],
            "error: --bogus: no such flag (see 'tf-limiter sim env --help')",
        ),
        (
            ["sim", "run"],
            "error: missing argument '-- CMD [ARG]...' (see 'tf-limiter sim run --help')",
        ),
        (["sim", "env", "--devices"], "error: option '--devices' requires an argument"),
    ],
)
def test_bad_cli_usage_exits_2(args: list[str], message: str) -> None:
    # typer's own usage errors, in one line as every tf-* command's.
    result = tf_limiter(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == message + "\n"


def test_devices_on_an_existing_state_says_it_is_not_used(tmp_path: Path) -> None:
    state = tmp_path / "node.state"
    count = [
        "--",
        sys.executable,
        "-c",
        "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())",
    ]
    fresh = tf_limiter("sim", "run", "--devices", "count=4", "--state", str(state), *count)
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (0, "4\n", "")
    again = tf_limiter("sim", "run", "--devices", "count=2", "--state", str(state), *count)
    assert again.stdout == "4\n"
    assert again.stderr == (
        f"warning: --devices count=2: not used: the state file {state} exists and keeps its"
        " devices (remove it, or give another --state)\n"
    )
