"""The preamble every vgpu command-line tool shares: Typer apps that show their help when called
bare, hide local variables from tracebacks, answer --version, print plain help that wraps at the
terminal's width (rich's boxed help cuts long flag names at 80 columns), and report usage errors
in one line."""

import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from typing import Annotated

import typer
from typer._click import exceptions as click  # typer's own copy of click

from vgpu_common.cli import USAGE_ERROR
from vgpu_common.usage_error import one_line


def sub_app(help: str) -> typer.Typer:
    """A group of commands (``tf-hypervisor pods``, ``tf-limiter sim``) in the same style."""
    return typer.Typer(
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
        rich_markup_mode=None,
    )


def command_app(program: str, distribution: str, help: str) -> typer.Typer:
    """The app of ``program`` (its name on the command line), whose --version prints the
    installed version of ``distribution``."""
    app = typer.Typer(
        help=help, no_args_is_help=True, pretty_exceptions_show_locals=False, rich_markup_mode=None
    )

    def show_version(value: bool) -> None:
        if value:
            try:
                installed = distribution_version(distribution)
            except PackageNotFoundError:  # run from a source tree that is not installed
                installed = "unknown"
            print(f"{program} {installed}")
            raise typer.Exit()

    @app.callback()
    def _options(
        version: Annotated[
            bool,
            typer.Option(
                "--version",
                callback=show_version,
                is_eager=True,
                help="Print the version and exit.",
            ),
        ] = False,
    ) -> None:
        pass

    return app


def run_app(app: typer.Typer, program: str, args: list[str] | None = None) -> None:
    """Run ``app`` as ``program``; a usage error (unknown command or flag, a value the flag's
    type refuses) is one line on stderr naming what was typed, and exit code 2."""
    args = sys.argv[1:] if args is None else args
    command = typer.main.get_command(app)
    try:
        code = command.main(args, prog_name=program, standalone_mode=False)
    except click.NoArgsIsHelpError as error:  # a bare group: its help
        assert error.ctx is not None
        print(error.ctx.get_help())
        raise SystemExit(USAGE_ERROR) from None
    except click.ClickException as error:
        print(f"error: {one_line(error, args)}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)
