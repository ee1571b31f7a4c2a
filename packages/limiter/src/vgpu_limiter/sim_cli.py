"""tf-limiter sim: the environment of the simulated GPU, programs on it, and its workload."""

import ctypes
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from vgpu_common.cli import exec_command, fail
from vgpu_common.command_app import sub_app

from vgpu_limiter import sim

app = sub_app(
    "The simulated GPU: a fake libcuda.so.1 and libnvidia-ml.so.1 sharing one node state."
)

DevicesOption = Annotated[
    str | None,
    typer.Option(
        "--devices",
        metavar="SPEC",
        help=(
            "The simulated devices (sets VGPU_SIM_DEVICES): a count, or ';'-separated specs "
            "of key=value such as 'count=2,memory=4GiB'. Used when the state file is created."
        ),
    ),
]
StateOption = Annotated[
    Path | None,
    typer.Option(
        "--state",
        metavar="PATH",
        help="The node-wide state file (sets VGPU_SIM_STATE); processes sharing it share the GPUs.",
    ),
]


def planned_environment(
    environ: Mapping[str, str], devices: str | None, state: Path | None
) -> dict[str, str]:
    """The variables to set so that programs (and pynvml) use the simulated GPU. --devices on
    a state file that exists cannot take effect: a line on stderr says so."""
    try:
        planned = sim.environment(
            devices=devices,
            # Absolute, so the variable still names the same file after a program changes folder.
            state=None if state is None else state.absolute(),
            base=environ,
        )
    except FileNotFoundError as error:
        fail(str(error))
    existing = sim.state_path({**environ, **planned})
    if devices is not None and existing.exists():
        print(
            f"warning: --devices {devices}: not used: the state file {existing} exists and keeps"
            " its devices (remove it, or give another --state)",
            file=sys.stderr,
        )
    return planned


@app.command()
def env(devices: DevicesOption = None, state: StateOption = None) -> None:
    """Print shell lines that put programs on the simulated GPU: eval "$(tf-limiter sim env)"."""
    for name, value in planned_environment(os.environ, devices, state).items():
        print(f"export {name}={shlex.quote(value)}")


@app.command(
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def run(
    command: Annotated[list[str], typer.Argument(metavar="-- CMD [ARG]...", show_default=False)],
    devices: DevicesOption = None,
    state: StateOption = None,
) -> NoReturn:
    """Run CMD on the simulated GPU."""
    exec_command(command, dict(os.environ) | planned_environment(os.environ, devices, state))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="[--devices SPEC] [--state PATH] [WORKLOAD OPTION]...",
)
def workload(
    ctx: typer.Context, devices: DevicesOption = None, state: StateOption = None
) -> NoReturn:
    """Run vgpu-sim-workload on the simulated GPU; it prints one JSON report.

    Options other than --devices and --state go to the workload, as does everything after --.

    Example: tf-limiter sim workload --path dlopen --kernels 100 --kernel-us 10000

    The workload's own options: tf-limiter sim workload -- --help
    """
    try:
        program = sim.workload_path()
    except FileNotFoundError as error:
        fail(str(error))
    environment = dict(os.environ) | planned_environment(os.environ, devices, state)
    exec_command([str(program), *ctx.args], environment)


@app.command("lose-gpu")
def lose_gpu(
    index: Annotated[int, typer.Argument(metavar="INDEX", help="The device's index.")],
    state: StateOption = None,
    back: Annotated[bool, typer.Option("--back", help="Bring the device back instead.")] = False,
) -> None:
    """Make a simulated device fall off the bus: every NVML query of it fails with
    NVML_ERROR_GPU_IS_LOST (as a real GPU that needs a reset) until --back."""
    path = sim.state_path(os.environ if state is None else {"VGPU_SIM_STATE": str(state)})
    if not path.is_file():
        fail(f"{path}: no simulated node there (a program on the simulated GPU makes it)")
    try:
        library = ctypes.CDLL(str(sim.library_dir() / "libnvidia-ml.so.1"))
    except (FileNotFoundError, OSError) as error:
        fail(str(error))
    os.environ["VGPU_SIM_STATE"] = str(path.absolute())  # read by the library's first call
    setter = library.vgpu_sim_set_lost
    setter.argtypes = [ctypes.c_uint, ctypes.c_int]
    setter.restype = ctypes.c_int
    if index < 0 or setter(index, 0 if back else 1) != 0:
        fail(f"{path}: no simulated device {index}")
    print(f"device {index} {'is back' if back else 'fell off the bus'}")
