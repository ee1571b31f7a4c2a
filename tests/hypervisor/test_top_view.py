"""`top`'s screen laid out for crowded nodes: every GPU's figures stay, lines never pass the
width or the height, and what does not fit is counted rather than cut."""

import io
import re

import pytest
from rich.console import Console
from vgpu_hypervisor.client.top_view import (
    History,
    Snapshot,
    ViewState,
    apply_key,
    render,
    shorten,
    words,
)

GiB = 1 << 30


def _node(gpus: int, pods: int) -> Snapshot:
    return Snapshot(
        status={"version": "0.1.0", "pods": pods, "workers": pods, "backend_description": "sim"},
        gpus=[
            {
                "index": i,
                "uuid": f"GPU-{i}",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_used": i * GiB,
                "memory_total": 80 * GiB,
                "utilization": 10 * i,
                "temperature_c": 40 + i,
                "power_draw_w": 100.0 + i,
                "boost": None,
                "pods": 1,
                "workers": 1,
            }
            for i in range(gpus)
        ],
        pods=[
            {
                "namespace": "default",
                "name": f"pod-{n:03d}-of-a-long-training-sweep",
                "error": None,
                "workers": 1,
                "gpus": [
                    {
                        "uuid": f"GPU-{n}",
                        "index": n % gpus,
                        "memory_used": n * GiB // 4,
                        "memory_limit": 4 * GiB,
                        "compute_limit": 30.0,
                        "utilization": n % 100,
                    }
                ],
            }
            for n in range(pods)
        ],
        workers=[
            {
                "namespace": "default",
                "pod": f"pod-{n:03d}-of-a-long-training-sweep",
                "pid": 1000 + n,
                "host_pid": 5000 + n,
                "started": None,
                "command": "/opt/conda/envs/train/bin/python3 train.py --epochs 90 --batch 256",
                "alive": True,
                "gpus": [{"uuid": f"GPU-{n % gpus}", "memory_used": GiB, "utilization": 5}],
            }
            for n in range(pods)
        ],
        taken=1.0,
    )


@pytest.mark.parametrize(("width", "height"), [(80, 24), (100, 30), (200, 50), (60, 20)])
@pytest.mark.parametrize(("gpus", "pods"), [(8, 40), (2, 0), (1, 3)])
def test_the_screen_fits(width: int, height: int, gpus: int, pods: int) -> None:
    lines = render(_node(gpus, pods), ViewState(), width, height).plain.split("\n")
    assert len(lines) == height
    assert all(len(line) <= width for line in lines)
    for index in range(gpus):
        row = next(line for line in lines if line.split()[:1] == [str(index)])
        assert f"{10 * index}%" in row and f"{40 + index}C" in row and f"{100 + index}W" in row
    text = "\n".join(lines)
    assert "..." not in text
    if pods > 10:
        assert "more (/ filters, s sorts)" in text
    assert any(line.startswith("q quit") for line in lines[-2:])  # wrapped between keys


def test_sort_and_filter_keys() -> None:
    state = ViewState()
    for key in "s":  # name -> memory
        assert apply_key(state, key)
    lines = render(_node(2, 5), state, 120, 40).plain.split("\n")
    pods = [line.split()[0] for line in lines if line.startswith("default/pod-")]
    assert pods[0].startswith("default/pod-004")  # the most memory first
    for key in "/pod-002\r":
        assert apply_key(state, key)
    lines = render(_node(2, 5), state, 200, 40).plain.split("\n")
    shown = [line.split()[0] for line in lines if line.startswith("default/pod-")]
    assert shown == ["default/pod-002-of-a-long-training-sweep"] * 2  # its pod and worker rows
    assert apply_key(state, "\x1b") and state.filter == ""
    assert not apply_key(state, "q")


def test_shorten_keeps_both_ends() -> None:
    assert shorten("default/abcdefghij", 30) == "default/abcdefghij"
    short = shorten("default/training-job-0042", 15)
    assert len(short) == 15 and short.startswith("default") and short.endswith("0042")


def test_an_absent_daemon_is_said_over_the_last_view() -> None:
    last = _node(2, 1)
    gone = Snapshot(last.status, last.gpus, last.pods, last.workers, "Connection refused", 2.0)
    text = render(gone, ViewState(), 80, 24).plain
    assert "daemon unreachable, retrying: Connection refused" in text and "(last view)" in text


BACKEND = "simulated GPU (2 devices, state kept in a shared file of the node)"
REASON = "cannot reach the daemon at http://127.0.0.1:8000 (Connection refused); is it running?"


def _screen(snapshot: Snapshot, state: ViewState, width: int, height: int) -> list[str]:
    """The screen as a terminal of that size shows it (rich's console at a fixed size)."""
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, color_system=None)
    console.print(render(snapshot, state, width, height, _history(snapshot)))
    lines = out.getvalue().split("\n")[:-1]
    assert len(lines) == height, lines  # nothing wrapped by the terminal
    return lines


def _history(snapshot: Snapshot) -> History:
    history = History()
    for step in range(5):
        history.record(Snapshot(gpus=snapshot.gpus, taken=snapshot.taken - 5 + step))
    return history


def _words_whole(line: str, text: str) -> None:
    """Every word of ``line`` that begins one of ``text``'s words is that word whole, or ends
    the line's part in "…" (cut between words, never inside one)."""
    for word in re.findall(r"\S+", line):
        if word.endswith("…"):
            assert text.find(" " + word[:-1]) >= 0 or text.startswith(word[:-1]), (word, text)
        else:
            assert word in text.split(), (word, line)


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40)])
@pytest.mark.parametrize("mode", ["auto", "compact", "full"])
@pytest.mark.parametrize("help_shown", [False, True])
def test_nothing_is_cut_inside_a_word(width: int, height: int, mode: str, help_shown: bool) -> None:
    snapshot = _node(2, 3)
    snapshot.status["backend_description"] = BACKEND
    state = ViewState(mode=mode, show_help=help_shown)
    lines = _screen(snapshot, state, width, height)
    assert all(len(line) <= width for line in lines)
    title = "tf-hypervisor 0.1.0 " + lines[0].split()[2] + "  3 pods, 3 workers  " + BACKEND
    _words_whole(lines[0], title)
    assert "3 pods, 3 workers" in lines[0]
    # Every GPU's name and figures whole, in either mode.
    for index in range(2):
        row = next(line for line in lines if line.split()[:1] == [str(index)])
        for cell in ("NVIDIA H100 80GB HBM3", f"{index}.0GiB/80.0GiB" if index else "0B/80.0GiB"):
            assert cell in row, row
        assert f"{10 * index}%" in row.split() and f"{40 + index}C" in row.split()
        assert f"{100 + index}W" in row.split()
    # Pods whole or around a "~" with both ends kept; numbers whole.
    for line in lines:
        if line.startswith("default/"):
            pod = line.split()[0]
            head, cut, tail = pod.partition("~")
            if cut:
                assert head.startswith("default") and len(tail) >= 4, pod
                assert "default/pod-000-of-a-long-training-sweep".endswith(tail), pod
            else:
                assert re.fullmatch(r"default/pod-00\d-of-a-long-training-sweep", pod), pod
    # Workers: their GPU by index, the program's name first, arguments trimmed at the end.
    header = next(i for i, line in enumerate(lines) if line.startswith("Pod") and "PID" in line)
    assert "Command" in lines[header]
    gpu = lines[header].index(" GPU ") + 1
    for line in lines[header + 1 : header + 4]:
        assert line[gpu : gpu + 2] in ("0 ", "1 "), line
        assert "python3 train.py" in line and "/opt/conda" not in line
    footer = [line for line in lines if line.strip()][-3 if help_shown else -1 :]
    for line in footer:
        _words_whole(line, " ".join(footer))


@pytest.mark.parametrize("width", [80, 120])
def test_the_unreachable_daemon_is_wrapped_between_words(width: int) -> None:
    last = _node(2, 1)
    gone = Snapshot(last.status, last.gpus, last.pods, last.workers, REASON, 2.0)
    lines = _screen(gone, ViewState(), width, 24)
    said = lines[1 : lines.index("(last view)")]
    assert " ".join(said) == f"daemon unreachable, retrying: {REASON}"
    for line in said:
        _words_whole(line, " ".join(said))


def test_words_cuts_between_words() -> None:
    assert words("simulated GPU (2 devices)", 40) == "simulated GPU (2 devices)"
    assert words("simulated GPU (2 devices)", 16) == "simulated GPU…"
    assert words("simulated GPU (2 devices)", 14) == "simulated GPU…"
    assert words("simulated GPU (2 devices)", 13) == "simulated…"


def test_the_history_shows_after_a_few_refreshes() -> None:
    history = History()
    state = ViewState(mode="full")
    for step in range(6):
        snapshot = _node(2, 1)
        snapshot.taken = 100.0 + step
        snapshot.gpus[1]["utilization"] = 20 * step
        snapshot.gpus[1]["memory_used"] = 16 * step * GiB
        history.record(snapshot)
        history.record(snapshot)  # the same refresh drawn again adds nothing
        lines = render(snapshot, state, 120, 40, history).plain.split("\n")
    header = next(line for line in lines if "Util over 5s, peak" in line)
    assert "Memory over 5s, peak" in header
    row = lines[lines.index(header) + 2].split()
    assert row == ["1", "▁▂▄▅▇█", "100%", "▁▂▄▅▇█", "100%"]
    assert lines[lines.index(header) + 1].split()[:2] == ["0", "▁▁▁▁▁▁"]
    # A refresh that failed adds nothing; the compact mode has no room for it.
    history.record(Snapshot(gpus=snapshot.gpus, error="gone", taken=200.0))
    assert len(history.of(snapshot.gpus[1])) == 6
    assert "Util over" not in render(snapshot, ViewState(), 80, 24, history).plain
