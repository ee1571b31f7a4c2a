"""tf-limiter: the command-line entry point."""

from importlib.metadata import version as distribution_version

import typer

app = typer.Typer(
    help="Per-pod GPU memory and compute limits for unmodified CUDA programs.",
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
    print(distribution_version("vgpu-limiter"))


def main() -> None:
    app(prog_name="tf-limiter")
