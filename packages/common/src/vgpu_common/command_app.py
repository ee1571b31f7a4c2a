"""The preamble every vgpu command-line tool shares: a Typer app that shows its help when called
bare, hides local variables from tracebacks, and answers --version."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from typing import Annotated

import typer


def command_app(program: str, distribution: str, help: str) -> typer.Typer:
    """The app of ``program`` (its name on the command line), whose --version prints the
    installed version of ``distribution``."""
    app = typer.Typer(help=help, no_args_is_help=True, pretty_exceptions_show_locals=False)

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
