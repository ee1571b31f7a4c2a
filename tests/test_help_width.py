"""Help at 80 columns: every line fits, and every flag of every command is shown whole."""

from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner
from vgpu_add_path.cli import app as add_path_app
from vgpu_hypervisor.cli import app as hypervisor_app
from vgpu_limiter.cli import app as limiter_app

APPS = {"tf-hypervisor": hypervisor_app, "tf-limiter": limiter_app, "tf-add-path": add_path_app}


def _commands(
    command: typer.core.TyperGroup, path: list[str]
) -> Iterator[tuple[list[str], list[str]]]:
    """(the words that reach each command, its flags), groups included."""
    flags = [flag for param in command.params for flag in (*param.opts, *param.secondary_opts)]
    yield path, [flag for flag in flags if flag.startswith("-")]
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


@pytest.mark.parametrize("program", sorted(APPS))
def test_help_fits_80_columns_and_names_every_flag(program: str) -> None:
    app = APPS[program]
    root = typer.main.get_command(app)
    for path, flags in _commands(root, []):  # type: ignore[arg-type]
        result = CliRunner().invoke(
            app, [*path, "--help"], env={"COLUMNS": "80"}, prog_name=program
        )
        assert result.exit_code == 0, (path, result.output)
        lines = result.output.splitlines()
        assert max(len(line) for line in lines) <= 80, (path, result.output)
        words = result.output.replace(",", " ").replace("/", " ").split()
        for flag in flags:
            assert flag in words, (path, flag, result.output)
