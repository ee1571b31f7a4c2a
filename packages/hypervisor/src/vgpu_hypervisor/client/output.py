"""How the listings print: a table, a wider table, JSON or YAML (`-o`, and `--json`)."""

import json
import os
from enum import StrEnum
from typing import Annotated, Any

import typer
from vgpu_common.cli import fail
from vgpu_common.visible import visible


class Form(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"


OutputOption = Annotated[
    Form | None,
    typer.Option(
        "--output",
        "-o",
        help="table (default), wide (every column), json, yaml or name (one a line).",
        show_default=False,
        case_sensitive=False,
    ),
]


class DocumentForm(StrEnum):
    """`-o` of a command that prints one document, not a listing (status, pods describe, shm
    show): no column to add for wide, no names to list. Its own choices refuse those as a usage
    error, where Form's took them and printed the table without a word."""

    table = "table"
    json = "json"
    yaml = "yaml"


class DeletedForm(StrEnum):
    """`-o` of pods delete: the deleted pod's document, or its name for a script (no table to
    widen)."""

    table = "table"
    json = "json"
    yaml = "yaml"
    name = "name"


DocumentOutputOption = Annotated[
    DocumentForm | None,
    typer.Option(
        "--output",
        "-o",
        help="table (default), json or yaml.",
        show_default=False,
        case_sensitive=False,
    ),
]
DeletedOutputOption = Annotated[
    DeletedForm | None,
    typer.Option(
        "--output",
        "-o",
        help="table (default: a line saying so), json, yaml or name (NAMESPACE/NAME).",
        show_default=False,
        case_sensitive=False,
    ),
]


def choose(form: Form | DocumentForm | DeletedForm | None, as_json: bool) -> Form:
    if as_json and form not in (None, Form.json):
        fail(f"--json and --output {form} disagree: give one of them")
    return Form.json if as_json else Form(form or Form.table)


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


def show(document: Any, form: Form, kind: str, indexes: dict[str, int] | None = None) -> None:
    """A listing (kind: gpus, pods or workers) in the chosen form; ``indexes``: GPU index by
    UUID, for the workers' GPU column."""
    if print_document(document, form):
        return
    if form is Form.name:
        for line in names(document, kind):
            print(line)
        return
    from rich.console import Console

    from vgpu_hypervisor.client import tables
    from vgpu_hypervisor.client.fit import print_table

    wide = form is Form.wide
    console = Console()
    # Off a terminal rich would fold at 80 columns: a pipe gets 160, and wide its full length.
    off_terminal = not console.is_terminal and "COLUMNS" not in os.environ
    width = 160 if off_terminal else console.width
    fit = None if wide else width
    if kind == "gpus":
        table = tables.gpu_table(document, width=fit, wide=wide)
    elif kind == "pods":
        pods = document if isinstance(document, list) else [document]
        table = tables.pod_table(pods, width=fit, wide=wide)
    else:
        table = tables.worker_table(document, width=fit, wide=wide, indexes=indexes)
    print_table(table, width)
    if kind == "pods" and not wide:
        for line in tables.pod_errors(document if isinstance(document, list) else [document]):
            print(f"error: {line}")


def names(document: Any, kind: str) -> list[str]:
    """`-o name`: what names each item to the other commands, one a line: pods as
    NAMESPACE/NAME, GPUs by UUID, workers by pid; a control character as its escape, so that
    each name stays one line."""
    items = document if isinstance(document, list) else [document]
    if kind == "pods":
        return [visible(f"{item['namespace']}/{item['name']}") for item in items]
    if kind == "gpus":
        return [visible(str(item.get("uuid") or item["index"])) for item in items]
    return [str(item["pid"]) for item in items]
