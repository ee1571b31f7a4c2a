"""`tf-hypervisor top` in a real pseudo-terminal, read back through a terminal emulator (pyte):
what a user sees at 80x24 and at 200x50, its keys, and a daemon that comes and goes."""

import fcntl
import os
import select
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pyte
import pytest
from vgpu_hypervisor.client.api_client import API

from tests.hypervisor.conftest import TF_HYPERVISOR, WORKLOAD, Daemon, wait_for

LONG_POD = "training-job-of-the-vision-team-resnet50-sweep-0042"


class Terminal:
    """A program on a pty of a given size, its output drawn on an emulated screen."""

    def __init__(self, command: list[str], env: dict[str, str], columns: int, lines: int) -> None:
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.lock = threading.Lock()
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        environment = env | {"TERM": "xterm-256color"}
        environment.pop("COLUMNS", None)
        environment.pop("LINES", None)
        self.process = subprocess.Popen(
            command,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=environment,
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                if self.process.poll() is not None:
                    return
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the program is gone and the pty closed
                return
            if not data:
                return
            with self.lock:
                self.stream.feed(data)

    def text(self) -> list[str]:
        with self.lock:
            return list(self.screen.display)

    def shows(self, *words: str) -> list[str] | None:
        lines = self.text()
        joined = "\n".join(lines)
        return lines if all(word in joined for word in words) else None

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.reader.join(timeout=5)
        os.close(self.master)


@pytest.fixture
def node(daemon: Daemon) -> Iterator[Daemon]:
    assert (
        daemon.cli("pods", "create", LONG_POD, "--mem", "0=4GiB", "--compute", "0=30").returncode
        == 0
    )
    assert daemon.cli("pods", "create", "small", "--mem", "1=2GiB").returncode == 0
    # The pod has GPU 1 only, which its programs see as their device 0.
    worker = daemon.workload("small", "--device", "0", "--alloc", "1GiB", "--hold", "60")
    try:
        wait_for(lambda: "small" in daemon.cli("workers").stdout, timeout=30)
        yield daemon
    finally:
        worker.kill()
        worker.communicate(timeout=10)


def _top(daemon: Daemon, columns: int, lines: int) -> Terminal:
    command = [*TF_HYPERVISOR, "top", "--interval", "0.3", *daemon.flags]
    return Terminal(command, daemon.environment, columns, lines)


def _gpu_rows(lines: list[str]) -> list[str]:
    header = next(
        i
        for i, line in enumerate(lines)
        if line.split()[:2] == ["GPU", "Memory"] or line.split()[:2] == ["GPU", "Name"]
    )
    return [lines[header + 1], lines[header + 2]]


def _history_of(terminal: Terminal, gpu: int, samples: int) -> list[str] | None:
    """The screen once GPU ``gpu``'s history row has ``samples`` marks or more."""
    lines = terminal.text()
    header = next((i for i, line in enumerate(lines) if "Util over" in line), None)
    if header is None:
        return None
    row = next((line for line in lines[header + 1 :] if line.split()[:1] == [str(gpu)]), "")
    marks = sum(1 for char in row if char in "▁▂▃▄▅▆▇█")
    return lines if marks >= 2 * samples else None


def _without(terminal: Terminal, prefix: str) -> list[str] | None:
    lines = terminal.text()
    return None if any(line.startswith(prefix) for line in lines) else lines


@pytest.mark.parametrize(("columns", "lines"), [(80, 24), (120, 40), (200, 50)])
def test_top_fits_the_terminal(node: Daemon, columns: int, lines: int) -> None:
    terminal = _top(node, columns, lines)
    try:
        screen = wait_for(
            lambda: terminal.shows("default/small", "Util", "Temp", "Power", "q quit"), timeout=30
        )
        header_line = next(line for line in screen if line.lstrip().startswith("GPU "))
        for title in ("GPU", "Util", "Temp", "Power", "Memory"):
            assert title in header_line
        rows = _gpu_rows(screen)
        for index, row in enumerate(rows):
            cells = row.split()
            assert cells[0] == str(index)
            assert any(cell.endswith("%") for cell in cells), row  # Util
            assert any(cell.endswith("C") for cell in cells), row  # Temp
            assert any(cell.endswith("W") for cell in cells), row  # Power
        print("\n".join(screen))
        assert "..." not in "\n".join(screen)
        # Only the backend's description in the title and a command's arguments are trimmed,
        # at the end of their line and between words.
        assert all("…" not in line.rstrip()[:-1] for line in screen)
        trimmed = [line.rstrip() for line in screen if line.rstrip().endswith("…")]
        assert all(line.startswith(("default/small", "tf-hypervisor")) for line in trimmed)
        backend = node.api("GET", f"{API}/status").json()["backend_description"]
        if screen[0].rstrip().endswith("…"):
            shown = screen[0].rstrip()[:-1].split("  ")[-1]
            assert backend.startswith(shown) and backend[len(shown)] == " ", screen[0]
        else:
            assert screen[0].rstrip().endswith(backend) or backend not in screen[0]
        assert len(screen) == lines and all(len(line) == columns for line in screen)
        pod_line = next(line for line in screen if line.startswith("default/train"))
        pod = pod_line.split()[0]
        if columns >= 120:
            assert pod == f"default/{LONG_POD}"
        else:  # shortened in the middle: both ends stay recognisable
            assert "~" in pod
            head, _, tail = pod.partition("~")
            assert f"default/{LONG_POD}".startswith(head) and LONG_POD.endswith(tail)
            assert len(head) >= 8 and len(tail) >= 8
        # The compact mode below 120 columns, the full one (with GPU names) above.
        assert "NVIDIA" in header_line or "Name" in header_line
        if columns >= 120:
            assert any("NVIDIA" in row for row in rows)
        # The worker's row names its GPU by index and its program first.
        header = next(line for line in screen if line.startswith("Pod") and "Command" in line)
        gpu = header.index(" GPU ") + 1
        worker = next(
            line for line in screen[screen.index(header) :] if line.startswith("default/small")
        )
        assert worker[gpu : gpu + 2] == "1 ", worker
        program = Path(WORKLOAD).name
        assert worker[header.index("Command") :].startswith(program), worker
        if columns >= 120:  # the history fills in as top refreshes (every 0.3 s)
            screen = wait_for(lambda: _history_of(terminal, 1, 3), timeout=30)
        terminal.send("q")
        assert terminal.process.wait(timeout=15) == 0
    finally:
        terminal.close()


def test_top_keys_sort_filter_help(node: Daemon) -> None:
    terminal = _top(node, 80, 24)
    try:
        wait_for(lambda: terminal.shows("default/small", "sort: name"), timeout=30)
        terminal.send("s")
        wait_for(lambda: terminal.shows("sort: memory"), timeout=10)
        terminal.send("/smal\r")
        screen = wait_for(lambda: terminal.shows("filter: smal"), timeout=10)
        lines = wait_for(lambda: _without(terminal, "default/train"), timeout=10)
        assert any(line.startswith("default/small") for line in lines), screen
        terminal.send("\x1b")
        wait_for(
            lambda: any(line.startswith("default/train") for line in terminal.text()), timeout=10
        )
        terminal.send("h")
        wait_for(lambda: terminal.shows("s: sort pods and workers by name"), timeout=10)
        terminal.send("Q")
        assert terminal.process.wait(timeout=15) == 0
    finally:
        terminal.close()


def test_top_waits_for_the_daemon_and_outlives_it(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    terminal = _top(daemon, 80, 24)
    try:
        wait_for(lambda: terminal.shows("daemon unreachable, retrying"), timeout=30)
        assert terminal.process.poll() is None
        daemon.start()
        wait_for(
            lambda: terminal.shows("Temp", "Power") and not terminal.shows("unreachable"),
            timeout=30,
        )
        daemon.stop()
        wait_for(lambda: terminal.shows("daemon unreachable, retrying"), timeout=30)
        assert terminal.process.poll() is None
        terminal.send("q")
        assert terminal.process.wait(timeout=15) == 0
    finally:
        terminal.close()
        daemon.close()
