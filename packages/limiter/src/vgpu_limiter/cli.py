"""tf-limiter: the command-line entry point."""

from importlib.metadata import version as distribution_version

from vgpu_common.command_app import command_app, run_app

from vgpu_limiter.config_cli import check_config
from vgpu_limiter.coverage_cli import coverage
from vgpu_limiter.region_cli import inspect
from vgpu_limiter.run_cli import path, run
from vgpu_limiter.sim_cli import app as sim_app

app = command_app(
    "tf-limiter",
    "vgpu-limiter",
    "Per-pod GPU memory and compute limits for unmodified CUDA programs.",
)
app.command()(path)
app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})(
    run
)
app.command()(inspect)
app.command("check-config")(check_config)
app.command()(coverage)
app.add_typer(sim_app, name="sim")


@app.command()
def version() -> None:
    """Print the installed version."""
    print(distribution_version("vgpu-limiter"))


def main() -> None:
    run_app(app, "tf-limiter")


if __name__ == "__main__":
    main()
