"""The daemon's life and the CLI's errors: signals, a failing task, listen addresses, no daemon."""

import asyncio
import contextlib
import itertools
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import pytest
from vgpu_hypervisor.daemon.service import _every

from tests.hypervisor.conftest import TF_HYPERVISOR, Daemon, clean_environment, wait_for


def test_sigint_stops_cleanly(daemon: Daemon) -> None:
    assert daemon.stop(signal.SIGINT) == 0
    assert daemon.log_file.read_text().rstrip().endswith("stopped")


def test_a_failing_task_is_logged_and_restarted(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        # The metrics file made a folder while the daemon runs: it cannot be written (one
        # that is a folder at the start stops the daemon there instead).
        wait_for(daemon.metrics_file.is_file, timeout=10)
        daemon.metrics_file.unlink()
        daemon.metrics_file.mkdir()
        wait_for(lambda: "metrics file failed" in daemon.log_file.read_text(), timeout=10)
        assert "restarting in" in daemon.log_file.read_text()
        assert daemon.http.get("/healthz").status_code == 200
        daemon.metrics_file.rmdir()  # fixed: the restarted task writes
        wait_for(daemon.metrics_file.is_file, timeout=10)
        assert daemon.http.get("/readyz").json()["checks"]["tasks"] == "ok"
    finally:
        daemon.close()


def test_unix_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "api.sock"
    daemon = Daemon(tmp_path, extra=("--listen", f"unix:{socket_path}"))
    daemon.http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://daemon"
    )
    daemon.start()
    try:
        listing = subprocess.run(
            [
                *TF_HYPERVISOR,
                *("gpus", "--json", "--listen", f"unix:{socket_path}"),
                *("--token-file", str(daemon.token_file)),
            ],
            env=daemon.environment,
            capture_output=True,
            text=True,
            check=False,
        )
        assert listing.returncode == 0, listing.stderr
        assert len(json.loads(listing.stdout)) == 2
    finally:
        assert daemon.stop() == 0
        daemon.close()
    assert not socket_path.exists()


def _client(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TF_HYPERVISOR, *args],
        env=clean_environment() | extra,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("args", "extra", "code", "words"),
    [
        (("status", "--listen", "127.0.0.1:1"), {}, 1, "cannot reach the daemon at 127.0.0.1:1"),
        (("gpus",), {"API_LISTEN_ADDR": "127.0.0.1:1"}, 1, "cannot reach the daemon"),
        (("status", "--listen", "nowhere"), {}, 2, "--listen=nowhere"),
        (
            ("pods", "create", "p", "--mem", "0=1GiB", "--token-file", "/nonexistent/token"),
            {},
            1,
            "cannot read the API token /nonexistent/token",
        ),
        (
            ("pods", "create", "p"),
            {},
            2,
            "give at least one --mem, --compute, --burst or --oversubscribe",
        ),
        (("pods", "create", "p", "--mem", "1GiB"), {}, 2, "expected GPU=VALUE"),
        (("pods", "create", "a/p", "-n", "b", "--mem", "0=1G"), {}, 2, "disagree"),
        (("shm", "show", "default/none", "--shm-base-path", "/nonexistent"), {}, 1, "no such pod"),
    ],
)
def test_cli_errors_are_one_line(
    args: tuple[str, ...], extra: dict[str, str], code: int, words: str
) -> None:
    result = _client(*args, **extra)
    assert result.returncode == code, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert words in result.stderr


def test_daemon_start_errors(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    result = _client(
        "daemon",
        "--simulate",
        "--sim-state",
        str(tmp_path / "state"),
        "--token-file",
        str(blocked / "token"),
        "--shm-base-path",
        str(tmp_path / "shm"),
    )
    assert result.returncode == 1
    assert "cannot create the API token file" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: ")


def test_shm_show_reads_a_region_without_the_daemon(daemon: Daemon) -> None:
    body = {"name": "s", "gpus": {"0": {"memory": "2GiB", "compute": 40}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    daemon.stop()
    shown = _client("shm", "show", "s", "--shm-base-path", str(daemon.base), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    (device,) = report["devices"]
    assert device["memory_limit"] == 2 << 30
    table = _client("shm", "show", "default/s", "--shm-base-path", str(daemon.base))
    assert table.returncode == 0 and "default/s" in table.stdout and "40" in table.stdout


@pytest.mark.parametrize("key", [b"q", b"\x03"])
def test_top_in_a_terminal_quits_on_q_and_ctrl_c(daemon: Daemon, key: bytes) -> None:
    pid, terminal = pty.fork()
    if pid == 0:  # the child: top on the pty
        os.execve(
            sys.executable,
            [*TF_HYPERVISOR, "top", "--interval", "0.2", *daemon.flags],
            daemon.environment,
        )
    shown = b""
    deadline = time.monotonic() + 20
    while b"q quit" not in shown or shown.count(b"tf-hypervisor") < 2:
        assert time.monotonic() < deadline, shown
        ready, _, _ = select.select([terminal], [], [], 0.1)
        if ready:
            shown += os.read(terminal, 65536)
    assert not termios.tcgetattr(terminal)[3] & termios.ICANON  # keys arrive one by one
    os.write(terminal, key)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert termios.tcgetattr(terminal)[3] & termios.ICANON  # the terminal is restored
    os.close(terminal)


def test_pod_passes_come_sooner_once_something_asks_for_it_between_them() -> None:
    """The daemon's passes every second come a quarter second apart while a pod that started
    to want a GPU waits for its use to be measured, whichever pass saw it start (an API
    request's, between two periodic ones): the loop asks again while it waits."""
    runs: list[float] = []
    hurry: list[bool] = [False]

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(_every(1.0, lambda: runs.append(loop.time()), sooner))
        await asyncio.sleep(0.1)
        hurry[0] = True  # another pass saw a pod start to want a GPU
        await asyncio.sleep(0.5)
        hurry[0] = False
        await asyncio.sleep(0.2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def sooner() -> float | None:
        return 0.25 if hurry[0] else None

    asyncio.run(scenario())
    gaps = [later - earlier for earlier, later in itertools.pairwise(runs)]
    # Two passes within the half second instead of none before the next second's.
    assert len(runs) >= 3, runs
    assert gaps[0] == pytest.approx(0.25, abs=0.15), gaps


def test_a_region_that_breaks_while_the_daemon_runs_is_logged_once(daemon: Daemon) -> None:
    """Listings and /metrics showed it; the log said nothing until the next start."""
    created = daemon.cli("pods", "create", "p", "--mem", "0=1GiB")
    assert created.returncode == 0, created.stderr
    region = daemon.base / "default" / "p" / "shm"
    whole = region.read_bytes()
    os.truncate(region, 100)
    wait_for(lambda: "pod default/p: " in daemon.log_file.read_text(), timeout=10)
    time.sleep(2.5)  # (the mapped file reads as truncated, then, opened again, as too small)
    said = daemon.log_file.read_text().count("pod default/p: ")
    time.sleep(2.5)  # more passes: nothing new to say
    log = daemon.log_file.read_text()
    assert 1 <= log.count("pod default/p: ") == said <= 2, log
    assert "truncated (100 of" in log.split("pod default/p: ", 1)[1].splitlines()[0]
    region.write_bytes(whole)
    wait_for(lambda: "its region can be read again" in daemon.log_file.read_text(), timeout=10)
