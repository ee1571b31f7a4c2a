"""Tenants' text in the admin's terminal: a worker's process name, a region's namespace, name and
GPU UUIDs are the tenant's to write. Shown raw (`workers`, `pods list` and `describe`, `top`,
`shm show`), an escape sequence in one ran in the admin's terminal and a newline forged a row;
each control character is now shown as its escape, and text in brackets is never markup."""

import io
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from vgpu_common.limits import GpuLimits
from vgpu_common.visible import CONTROL_CODES
from vgpu_hypervisor.client import output
from vgpu_hypervisor.client.describe import describe_pod
from vgpu_hypervisor.client.tables import worker_table
from vgpu_hypervisor.client.top_view import Snapshot, ViewState, render
from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_limiter import region as regions
from vgpu_limiter.region_report import print_tables

from tests.hypervisor.conftest import TF_HYPERVISOR, WORKLOAD, Daemon, clean_environment, wait_for
from tests.hypervisor.test_boost import SIM_GPU0
from tests.limiter.test_region import raw

# What the review started a worker as: `exec -a $'\e]0;PWNED\a\e[31mred\nfake line' sleep 300`
# (retitles the terminal, turns it red, forges a line), with rich markup and a C1 CSI after.
FORGED = "fake line"
HOSTILE = f"\x1b]0;PWNED\x07\x1b[31mred\n{FORGED}\r\x9b2J [bold red]x[/]"
SHOWN = "\\x1b]0;PWNED\\x07\\x1b[31mred\\x0afake line\\x0d\\x9b2J [bold red]x[/]"


def _safe(text: str) -> None:
    """``text`` holds no control character but its line ends, no line the tenant began, and the
    tenant's text as its escapes (its brackets as they were: not read as markup)."""
    assert not [char for char in text if ord(char) in CONTROL_CODES and char != "\n"], text
    assert not [line for line in text.splitlines() if line.lstrip().startswith(FORGED)], text


def _pod(name: str = HOSTILE, error: str | None = None) -> dict[str, Any]:
    return {
        "namespace": "default",
        "name": name,
        "path": f"/run/vgpu/default/{name}/shm",
        "created": 0.0,
        "error": error,
        "workers": 1,
        "gpus": [
            {
                "uuid": name,
                "index": None,
                "memory_limit": 1 << 30,
                "memory_used": 0,
                "compute_limit": 30.0,
                "utilization": None,
            }
        ],
    }


def _worker(command: str = HOSTILE) -> dict[str, Any]:
    return {
        "namespace": "default",
        "pod": command,
        "slot": 0,
        "pid": 7,
        "host_pid": 7,
        "started": 0.0,
        "command": command,
        "alive": False,
        "last_gpu_call": None,
        "gpus": [{"uuid": command, "memory_used": 1 << 20, "utilization": 3}],
        "container": command,
    }


GPU = {"index": 0, "uuid": HOSTILE, "name": HOSTILE, "memory_used": 0, "memory_total": 1 << 30}


@pytest.mark.parametrize("form", [output.Form.table, output.Form.wide, output.Form.name])
@pytest.mark.parametrize(
    ("kind", "document"),
    [
        ("workers", [_worker()]),
        ("pods", [_pod(), _pod("ok"), _pod(error=HOSTILE)]),
        ("gpus", [GPU]),
    ],
)
def test_the_listings_show_tenants_text_as_escapes(
    capsys: pytest.CaptureFixture[str], form: output.Form, kind: str, document: Any
) -> None:
    output.show(document, form, kind, {})
    shown = capsys.readouterr().out
    _safe(shown)
    if form is output.Form.wide or (form is output.Form.name and kind != "workers"):
        assert SHOWN in shown  # whole (the narrow table may shorten it; workers go by pid)


def test_describe_shows_tenants_text_as_escapes() -> None:
    pod = _pod(error=HOSTILE) | {"worker_list": [_worker()]}
    text = describe_pod(pod, now=0.0)
    _safe(text)
    assert text.count(SHOWN) == 7  # name, region, error, GPU, and the worker's command and GPU
    plain = _pod(name="plain", error="plain") | {"worker_list": [_worker("plain")]}
    assert text.count("\n") == describe_pod(plain, now=0.0).count("\n")  # no line added


def test_top_shows_tenants_text_as_escapes() -> None:
    snapshot = Snapshot(
        status={"version": HOSTILE, "pods": 2, "workers": 1, "backend_description": HOSTILE},
        gpus=[GPU],
        pods=[_pod(), _pod("broken", error=HOSTILE)],
        workers=[_worker()],
        taken=1.0,
    )
    for width in (80, 200):
        screen = render(snapshot, ViewState(), width, 30).plain
        _safe(screen)
        assert len(screen.split("\n")) == 30
        failed = Snapshot(snapshot.status, error=HOSTILE, taken=1.0)
        _safe(render(failed, ViewState(), width, 30).plain)


def test_the_region_report_shows_the_regions_words_as_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    device = dict.fromkeys(
        ("memory_limit", "memory_used", "host_memory_used", "compute_soft_limit", "generation"), 0
    ) | {"index": 0, "uuid": HOSTILE, "compute_percent": None, "oversubscribe": False}
    process = {"slot": 0, "pid": 7, "host_pid": 0, "pid_namespace": 1, "start_time": 0}
    report = {
        "path": HOSTILE,
        "namespace": HOSTILE,
        "pod": HOSTILE,
        "version": 1,
        "created_ns": 0,
        "frozen": False,
        "devices": [device],
        "processes": [process | {"heartbeat_ns": 0, "memory": {HOSTILE: 1 << 20}}],
    }
    print_tables(report)
    shown = capsys.readouterr().out
    _safe(shown)
    assert "1.0 MiB" in shown  # the process's memory, found by the UUID as the region has it


# --- end to end: the CLI against a daemon, and a region read directly ----------------------


def test_a_workers_process_name_is_shown_as_escapes(
    daemon: Daemon, workloads: list[subprocess.Popen[str]]
) -> None:
    created = daemon.api("POST", "/api/v1/pods", json={"name": "t", "gpus": {"0": {}}})
    assert created.status_code == 201, created.text
    workloads.append(
        subprocess.Popen(
            [HOSTILE, "--alloc", "64MiB", "--hold", "60"],  # exec -a: argv[0] is the name
            executable=WORKLOAD,
            env=daemon.workload_environment("t"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    )

    def running() -> bool:
        workers = daemon.api("GET", "/api/v1/workers").json()
        return any("PWNED" in (worker["command"] or "") for worker in workers)

    wait_for(running, timeout=20)
    for args in (["workers"], ["workers", "-o", "wide"], ["pods", "describe", "t"]):
        shown = daemon.cli(*args)
        assert shown.returncode == 0, shown.stderr
        _safe(shown.stdout)
        assert "\\x1b]0;PWNED\\x07\\x1b[31mred\\x0afake" in shown.stdout


def test_shm_show_shows_the_regions_words_as_escapes(tmp_path: Path) -> None:
    store = PodStore(tmp_path / "base")
    try:
        store.create("default", "tenant", {SIM_GPU0: GpuLimits(compute=3000)})
    finally:
        store.close()
    path = regions.region_path(tmp_path / "base", "default", "tenant")
    with raw(path) as pointer:  # what the tenant can write into its own region
        pointer.pod_namespace = HOSTILE.encode()
        pointer.pod_name = HOSTILE.encode()
        pointer.devices[0].uuid = HOSTILE.encode()[:47]
    shown = subprocess.run(
        [*TF_HYPERVISOR, "shm", "show", "--path", str(path), "--config", ""],
        env=clean_environment() | {"COLUMNS": "200"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    _safe(shown.stdout)
    assert f"Pod {SHOWN}/{SHOWN}" in shown.stdout


def test_a_table_cell_is_measured_as_shown() -> None:
    """The escapes are what the columns are fitted to: no row passes the width it was given."""
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(worker_table([_worker()], width=100))
    assert all(len(line) <= 100 for line in out.getvalue().splitlines())
