"""How the listings print: a table, a wider table, JSON or YAML (`-o`, and `--json`)."""

import json
import os
from enum import StrEnum
from typing import Annotated, Any

import typer
from vgpu_common.cli import fail


class Form(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


OutputOption = Annotated[
    Form | None,
    typer.Option(
        "--output",
        "-o",
        help="table (default), wide (every column), json or yaml.",
        show_default=False,
        case_sensitive=False,
    ),
]


def choose(form: Form | None, as_json: bool) -> Form:
    if as_json and form not in (None, Form.json):
        fail(f"--json and --output {form} disagree: give one of them")
    return Form.json if as_json else form or Form.table


def print_document(document: Any, form: Form) -> bool:
    """Print JSON or YAML; False for the table forms, which the caller draws."""
    if form is Form.json:
        print(json.dumps(document, indent=2))
        return True
    if form is Form.yaml:
        import yaml

        print(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), end="")
        return True
    return False


def show(document: Any, form: Form, kind: str) -> None:
    """A listing (kind: gpus, pods or workers) in the chosen form."""
    if print_document(document, form):
        return
    from rich.console import Console

    from vgpu_hypervisor.client import tables

    wide = form is Form.wide
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Off a terminal rich would fold at 80 columns; wide rows carry UUIDs and paths.
        console = Console(width=400 if wide else 160)
    if kind == "gpus":
        console.print(tables.gpu_table(document, wide=wide))
    elif kind == "pods":
        pods = document if isinstance(document, list) else [document]
        console.print(tables.pod_table(pods, wide=wide))
    else:
        console.print(tables.worker_table(document, wide=wide))
