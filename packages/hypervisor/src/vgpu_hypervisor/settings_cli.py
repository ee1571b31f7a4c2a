"""The settings flags every tf-hypervisor command shares, and `config show`: the daemon's
effective settings and where each one comes from.

`settings_flags(...)` adds the flags of some settings to a command: typer sees them as the
command's own options, and the command receives them as `flags`, a mapping from field name to
the text given (None: not given) for load_settings. Values arrive as text, so a bad one gets the
settings' one-line error rather than a usage box.
"""

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import typer
from vgpu_common.cli import fail
from vgpu_common.command_app import sub_app

from vgpu_hypervisor.settings import (
    ENV_PREFIX,
    SETTINGS,
    ResolvedSettings,
    Setting,
    SettingsError,
    format_value,
    resolve_settings,
)


def _option_type(setting: Setting) -> Any:
    """The typer option of a setting; values arrive as text (a switch as a bool)."""
    if setting.metavar is None:
        switch = f"{setting.flag}/--no-{setting.flag.removeprefix('--')}"
        return Annotated[bool | None, typer.Option(switch, help=setting.help, show_default=False)]
    option = typer.Option(
        setting.flag, metavar=setting.metavar, help=setting.help, show_default=False
    )
    return Annotated[str | None, option]


JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
# The option type of each setting, by field name.
FLAG_TYPES: Mapping[str, Any] = {name: _option_type(s) for name, s in SETTINGS.items()}
# What a client command needs: where the daemon listens and its token.
CLIENT_SETTINGS = ("config_file", "api_listen_addr", "token_file")
Command = TypeVar("Command", bound=Callable[..., Any])


def settings_flags(*names: str) -> Callable[[Command], Command]:
    """Give a command the flags of the settings `names` (all when none are named); the command
    takes them as one keyword argument, `flags: Mapping[str, object]`."""
    chosen = names or tuple(FLAG_TYPES)

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command)
        own = [
            parameter for parameter in signature.parameters.values() if parameter.name != "flags"
        ]
        added = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=FLAG_TYPES[name]
            )
            for name in chosen
        ]

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            flags = {name: kwargs.pop(name, None) for name in chosen}
            return command(*args, flags=flags, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def print_table(resolved: ResolvedSettings) -> None:
    """One row per setting: value, source, and the sources it overrides."""
    # rich loads here only: the other commands start faster without it.
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("Setting", no_wrap=True)
    table.add_column("Value", overflow="fold")
    table.add_column("Source", overflow="fold")
    for name in type(resolved.settings).model_fields:
        source = Text(resolved.sources[name])
        overridden = resolved.overridden.get(name, ())
        if overridden:
            source.append(f" (over {', '.join(overridden)})", style="dim")
        value = format_value(name, getattr(resolved.settings, name))
        table.add_row(name, Text(value), source)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)  # off a terminal rich would fold the paths at 80 columns
    console.print(table)


@settings_flags()
def show(*, flags: Mapping[str, object], json_output: JsonFlag = False) -> None:
    try:
        resolved = resolve_settings(flags)
    except SettingsError as error:
        fail(str(error))
    for warning in resolved.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if json_output:
        print(json.dumps(resolved.as_json(), indent=2))
    else:
        print_table(resolved)


def _show_help() -> str:
    shared = [name for s in SETTINGS.values() for name in s.env if not name.startswith(ENV_PREFIX)]
    return (
        "Show the daemon's effective settings and where each comes from.\n\n"
        "Precedence: flag > environment > config file > default.\n"
        f"Environment: {ENV_PREFIX}<SETTING>, then the vgpu.rs names {', '.join(shared[:-1])} "
        f"and {shared[-1]}.\n"
        "A bad value: one line on stderr and exit code 2."
    )


app = sub_app("The daemon's configuration.")
app.command("show", help=_show_help())(show)
