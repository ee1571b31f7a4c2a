"""tf-hypervisor: the command-line entry point."""

from importlib.metadata import version as distribution_version

import typer

app = typer.Typer(
    help="The vgpu node daemon and its command-line client.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _group() -> None:
    # A callback keeps typer in sub-command mode while there is only one command.
    pass


@app.command()
def version() -> None:
    """Print the installed version."""
    print(distribution_version("vgpu-hypervisor"))


def main() -> None:
    app(prog_name="tf-hypervisor")
