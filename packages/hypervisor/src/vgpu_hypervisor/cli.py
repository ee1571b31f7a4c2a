"""tf-hypervisor: the command-line entry point."""

from importlib.metadata import version as distribution_version

import typer

from vgpu_hypervisor.settings_cli import app as config_app

app = typer.Typer(
    help="The vgpu node daemon and its command-line client.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.command()
def version() -> None:
    """Print the installed version."""
    print(distribution_version("vgpu-hypervisor"))


app.add_typer(config_app, name="config")


def main() -> None:
    app(prog_name="tf-hypervisor")
