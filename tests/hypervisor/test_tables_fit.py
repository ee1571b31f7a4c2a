"""The listings at 80 and 120 columns: every row on one line, no name or number cut; columns
drop by priority, and -o wide shows them all."""

import re
from typing import Any

import pytest
from vgpu_hypervisor.client import output
from vgpu_hypervisor.client.command_line import short_command

GiB = 1 << 30
UUID = "GPU-5157a1e0-0000-4000-8000-00000000000{}"


def _gpus() -> list[dict[str, Any]]:
    return [
        {
            "index": i, "uuid": UUID.format(i), "name": "NVIDIA H100 80GB HBM3",
            "memory_total": 80 * GiB, "memory_used": 12 * GiB + i, "utilization": 80,
            "memory_utilization": 12, "temperature_c": 41, "power_draw_w": 312.4,
            "sm_clock_mhz": 1980, "boost": 1.07, "pods": 3, "workers": 11,
        }
        for i in range(2)
    ]  # fmt: skip


def _pods() -> list[dict[str, Any]]:
    return [
        {
            "namespace": namespace, "name": name, "path": f"/run/tensor-fusion/shm/{name}/shm",
            "created": 1.7e9, "error": None, "workers": 2, "qos": "high", "weight": 4,
            "gpus": [
                {
                    "uuid": UUID.format(g), "index": g, "memory_limit": 40 * GiB,
                    "memory_used": 38 * GiB + 512 * 2**20, "host_memory_used": 3 * GiB,
                    "oversubscribe": True, "compute_limit": 33.33, "compute_burst": 100.0,
                    "utilization": 80,
                }
                for g in range(2)
            ],
        }
        for namespace, name in (
            ("default", "x2"), ("default", "x2b"), ("research", "llama-70b-finetune")
        )
    ] + [
        {
            "namespace": "default", "name": "broken", "path": "/x", "created": None,
            "error": "bad magic 0x00000000 (not a vgpu region, or written by another version)",
            "workers": 0, "gpus": [],
        }
    ]  # fmt: skip


def _workers() -> list[dict[str, Any]]:
    command = (
        "/opt/conda/envs/training/bin/python3.11 -m torch.distributed.run --nproc-per-node 8 "
        "train.py --config configs/llama-70b.yaml --batch-size 16"
    )
    return [
        {
            "namespace": "research", "pod": "llama-70b-finetune", "slot": 3, "pid": 4194301,
            "host_pid": 3999999, "started": 1.7e9, "command": command, "alive": alive,
            "last_gpu_call": 1.7e9, "container": None, "limited": True,
            "gpus": [{"uuid": UUID.format(1), "memory_used": 38 * GiB, "utilization": 80}],
        }
        for alive in (True, False)
    ]  # fmt: skip


def _shown(capsys: pytest.CaptureFixture[str], kind: str, document: object, form: str) -> str:
    output.show(document, output.Form(form), kind, {UUID.format(1).lower(): 1})
    return capsys.readouterr().out


@pytest.mark.parametrize("width", [80, 120])
def test_every_table_fits_and_cuts_nothing(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    gpus = _shown(capsys, "gpus", _gpus(), "table")
    pods = _shown(capsys, "pods", _pods(), "table")
    workers = _shown(capsys, "workers", _workers(), "table")
    for text in (gpus, pods, workers):
        table = text.split("error: ")[0]  # the errors under it: lines a terminal wraps
        assert max(len(line) for line in table.splitlines()) <= width, text
        assert "…" not in table.split("Command")[0]  # only a command is ever shortened
    for words in ("GPU", "Memory", "Util", "12.0 GiB / 80.0 GiB", "80%"):
        assert words in gpus, gpus
    for pod in _pods():
        assert f"{pod['namespace']}/{pod['name']}" in pods, pods
    for words in ("38.5 GiB / 40.0 GiB", "GPU", "33.33%", "Util"):
        assert words in pods, pods
    assert "research/llama-70b-finetune" in workers and "4194301" in workers
    assert "38.0 GiB" in workers and "python3.11 -m" in workers
    rows = [line for line in workers.splitlines() if "4194301" in line]
    assert len(rows) == 2  # one line a worker
    if width >= 120:
        assert "Command" in workers and "python3.11 -m torch" in workers, workers
        assert "/opt/conda" not in workers  # the program's name first, not its folder
        assert "(exited)" in workers
        assert re.search(r"GPU\s+GPU memory", workers)
    assert "error: default/broken: bad magic 0x00000000 (not a vgpu region" in pods


def test_wide_shows_every_column_in_full(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    pods = _shown(capsys, "pods", _pods(), "wide")
    for words in (
        "GPU UUID",
        UUID.format(0),
        "/run/tensor-fusion/shm/x2/shm",
        "high (4)",
        "3.0 GiB",
    ):
        assert words in pods
    workers = _shown(capsys, "workers", _workers(), "wide")
    assert "--batch-size 16" in workers and "Last GPU call" in workers
    gpus = _shown(capsys, "gpus", _gpus(), "wide")
    assert UUID.format(1) in gpus and "1980 MHz" in gpus


def test_a_name_wider_than_the_terminal_is_wrapped_not_cut(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    pod = _pods()[0] | {"name": "n" * 90}
    assert "n" * 90 in _shown(capsys, "pods", [pod], "table").replace("\n", "")


def test_a_command_keeps_its_program_and_note() -> None:
    line = short_command("/usr/local/bin/python3 -m train --epochs 300", "(exited)", width=24)
    assert line == "python3 -m tra… (exited)"
    assert short_command("/bin/sleep 5", width=40) == "sleep 5"


@pytest.mark.parametrize("form", ["table", "wide"])
def test_a_command_or_uuid_that_reads_as_markup_is_shown_as_written(
    form: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's command line is whatever its tenant ran, and a UUID in a pod's region is
    whatever it wrote: the cells went to rich as markup, so `python [/x]` failed the whole
    listing (MarkupError, a traceback: no worker of any pod shown) and `[bold]` vanished."""
    monkeypatch.setenv("COLUMNS", "160")
    workers = _workers()
    workers[0]["command"] = "python train.py [/x] [bold]loud"
    shown = _shown(capsys, "workers", workers, form)
    assert "[/x] [bold]loud" in shown and "research/llama-70b-finetune" in shown
    pods = _pods()
    pods[0]["gpus"][0] |= {"uuid": "[/gpu]", "index": None}
    assert "[/gpu]" in _shown(capsys, "pods", pods, form)
