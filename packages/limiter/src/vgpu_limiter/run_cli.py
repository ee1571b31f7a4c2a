"""tf-limiter path and run: locate the library, and run a program under it with limits."""

import json
import os
from typing import Annotated, NoReturn

import typer
from vgpu_common.cli import exec_command, fail

from vgpu_limiter import library_path
from vgpu_limiter.config import ConfigError, default_base, load_config
from vgpu_limiter.region import RegionError, open_region, region_path

MemOption = Annotated[
    list[str] | None,
    typer.Option(
        "--mem",
        metavar="DEV=SIZE",
        help="Memory limit of a device (index or GPU UUID), e.g. 0=4GiB. Repeatable.",
    ),
]
ComputeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--compute",
        metavar="DEV=PCT",
        help="Compute limit of a device in percent, e.g. 0=50. Repeatable.",
    ),
]
PodOption = Annotated[
    str | None,
    typer.Option(
        "--pod",
        metavar="[NAMESPACE/]NAME",
        help="The pod whose quota the program shares (default: a region private to it).",
    ),
]


def _library() -> str:
    try:
        return str(library_path())
    except FileNotFoundError as error:
        fail(str(error))


def _limits(flag: str, specs: list[str] | None, present: str | None) -> str | None:
    """["0=4GiB", "1=2GiB"] → '{"0": "4GiB", "1": "2GiB"}' (the library checks the values),
    added to the limits the environment's variable (``present``) already sets: a device given
    twice, or given a value the variable sets otherwise, is refused, never one of them dropped."""
    if not specs:
        return None
    variable = _FLAG_VARIABLES[flag]
    limits: dict[str, object] = {}
    if present is not None and present.strip():
        try:
            parsed: object = json.loads(present)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            fail(f"{variable}={present}: not a JSON object of limits (unset it, or give {flag})")
        limits = parsed
    from_variable = dict(limits)
    given: set[str] = set()
    for spec in specs:
        device, has_value, value = spec.partition("=")
        if not has_value or not device or not value:
            fail(f"{flag} {spec!r}: expected DEV=VALUE, e.g. {flag} 0=…")
        if device in given:
            fail(f"{flag} {spec}: device {device} given twice")
        if device in from_variable and str(from_variable[device]) != value:
            fail(
                f"{flag} {spec}: {variable} sets device {device} to {from_variable[device]} "
                "(unset it, or give the same value)"
            )
        given.add(device)
        limits[device] = value
        _check_value(flag, spec, json.dumps({device: value}))
    return json.dumps(limits)


def _check_value(flag: str, spec: str, limits: str) -> None:
    """One DEV=VALUE checked by the library's own rules, its error naming the flag given."""
    variable = _FLAG_VARIABLES[flag]
    try:
        _validate_quietly({**os.environ, variable: limits})
    except ConfigError as error:
        # "VARIABLE={...}: bad size ... for key ... (...)": the problem, after the JSON.
        problem = str(error).split("}: ", 1)[-1]
        fail(f"{flag} {spec}: {problem}")


_FLAG_VARIABLES = {
    "--mem": "TENSOR_FUSION_CUDA_MEM_LIMIT",
    "--compute": "TENSOR_FUSION_CUDA_UP_LIMIT",
}


def planned_environment(
    mem: list[str] | None, compute: list[str] | None, pod: str | None
) -> dict[str, str]:
    """This process's environment with the library preloaded and the flags applied."""
    environment = dict(os.environ)
    library = _library()
    preload = environment.get("LD_PRELOAD", "")
    if library not in preload.replace(" ", ":").split(":"):
        # First, so that its dlsym is the one programs reach.
        environment["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    for flag, specs in (("--mem", mem), ("--compute", compute)):
        variable = _FLAG_VARIABLES[flag]
        value = _limits(flag, specs, environment.get(variable))
        if value is not None:
            environment[variable] = value
    if pod is not None:
        namespace, _, name = pod.rpartition("/")
        try:  # said for the flag typed, not for the variable it becomes
            region_path("/", namespace or "default", name)
        except ValueError as error:
            fail(f"--pod {pod}: {error}")
        environment.pop("SHM_PATH", None)
        environment["POD_NAME"] = name
        environment["POD_NAMESPACE"] = namespace or "default"
        gpus = _pod_gpus(environment)
        # The pod's GPUs only, by UUID; a CUDA_VISIBLE_DEVICES of the user's own is kept (the
        # library still refuses contexts on GPUs the pod does not have).
        if gpus and "CUDA_VISIBLE_DEVICES" not in environment:
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return environment


def _pod_gpus(environment: dict[str, str]) -> list[str]:
    """The GPU UUIDs a pod's region lists; none when the pod has no region yet (the library
    then warns about the name) or its names are invalid (the library's check reports them)."""
    base = environment.get("SHM_BASE_PATH") or str(default_base())
    try:
        path = region_path(base, environment["POD_NAMESPACE"], environment["POD_NAME"])
        with open_region(path, writable=False) as region:
            return [device.uuid for device in region.devices]
    except (ValueError, OSError, RegionError):
        return []


def _validate_quietly(environment: dict[str, str]) -> None:
    """load_config() on ``environment``; ConfigError as it raises it."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(environment)
        load_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _validate(environment: dict[str, str]) -> None:
    """Reject what the library would refuse, with its own one-line message, before running."""
    try:
        _validate_quietly(environment)
    except ConfigError as error:
        fail(str(error))


def path() -> None:
    """Print the absolute path of libcuda_limiter.so."""
    print(_library())


def run(
    command: Annotated[list[str], typer.Argument(metavar="-- CMD [ARG]...", show_default=False)],
    mem: MemOption = None,
    compute: ComputeOption = None,
    pod: PodOption = None,
) -> NoReturn:
    """Run CMD with the limiter preloaded and the given limits."""
    environment = planned_environment(mem, compute, pod)
    _validate(environment)
    exec_command(command, environment)
