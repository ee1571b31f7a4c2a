"""tf-add-path: locate libadd_path.so, print the shell lines that enable it, or run under it."""

import os
import shlex
from collections.abc import Mapping
from typing import Annotated, NoReturn

import typer
from vgpu_common import cli as common_cli
from vgpu_common.cli import fail
from vgpu_common.command_app import command_app, run_app

from vgpu_add_path._library import SEPARATORS, library_path, merge

app = command_app(
    "tf-add-path",
    "vgpu-add-path",
    "Rewrite PATH, LD_PRELOAD and LD_LIBRARY_PATH of programs from TF_* variables.",
)


AppendOption = Annotated[
    list[str] | None,
    typer.Option(
        "--append", metavar="VAR=VALUE", help="Append entries to VAR (sets TF_<VAR>). Repeatable."
    ),
]
PrependOption = Annotated[
    list[str] | None,
    typer.Option(
        "--prepend",
        metavar="VAR=VALUE",
        help="Prepend entries to VAR (sets TF_PREPEND_<VAR>). Repeatable.",
    ),
]


def _flag_values(flag: str, specs: list[str] | None) -> dict[str, str]:
    """``["PATH=/a", "PATH=/b"]`` → ``{"PATH": "/a:/b"}``, in the order given."""
    values: dict[str, list[str]] = {}
    for spec in specs or []:
        name, has_value, value = spec.partition("=")
        if not has_value or name not in SEPARATORS:
            fail(f"{flag} {spec!r}: expected VAR=VALUE with VAR one of {', '.join(SEPARATORS)}")
        values.setdefault(name, []).append(value)
    return {name: ":".join(parts) for name, parts in values.items()}


def _library() -> str:
    try:
        return str(library_path())
    except FileNotFoundError as error:
        fail(str(error))


def planned_environment(
    environ: Mapping[str, str], append: list[str] | None, prepend: list[str] | None
) -> dict[str, str]:
    """The variables to set so that a program runs with the library and the flags applied."""
    changes: dict[str, str] = {}
    for name, value in _flag_values("--append", append).items():
        merged = merge(environ.get(f"TF_{name}"), None, value)
        if merged is not None:
            changes[f"TF_{name}"] = merged
    for name, value in _flag_values("--prepend", prepend).items():
        merged = merge(environ.get(f"TF_PREPEND_{name}"), value, None)
        if merged is not None:
            changes[f"TF_PREPEND_{name}"] = merged
    preload = merge(environ.get("LD_PRELOAD"), None, _library(), SEPARATORS["LD_PRELOAD"])
    if preload is not None:
        changes["LD_PRELOAD"] = preload
    return changes


@app.command()
def path() -> None:
    """Print the absolute path of libadd_path.so."""
    print(_library())


@app.command()
def env(append: AppendOption = None, prepend: PrependOption = None) -> None:
    """Print shell lines that enable the library: eval "$(tf-add-path env)"."""
    for name, value in planned_environment(os.environ, append, prepend).items():
        print(f"export {name}={shlex.quote(value)}")


@app.command(
    "exec",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def exec_command(
    command: Annotated[list[str], typer.Argument(metavar="-- CMD [ARG]...", show_default=False)],
    append: AppendOption = None,
    prepend: PrependOption = None,
) -> NoReturn:
    """Run CMD with the library preloaded and the given entries added."""
    environment = dict(os.environ)
    environment.update(planned_environment(environment, append, prepend))
    # Look the program up in the PATH it will itself see, so --prepend PATH=… finds it.
    search_path = merge(
        environment.get("PATH"), environment.get("TF_PREPEND_PATH"), environment.get("TF_PATH")
    )
    common_cli.exec_command(command, environment, search_path)


def main() -> None:
    run_app(app, "tf-add-path")
