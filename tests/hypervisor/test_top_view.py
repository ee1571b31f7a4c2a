"""`top`'s screen laid out for crowded nodes: every GPU's figures stay, lines never pass the
width or the height, and what does not fit is counted rather than cut."""

import pytest
from vgpu_hypervisor.client.top_view import Snapshot, ViewState, apply_key, render, shorten

GiB = 1 << 30


def _node(gpus: int, pods: int) -> Snapshot:
    return Snapshot(
        status={"version": "0.1.0", "pods": pods, "workers": pods, "backend_description": "sim"},
        gpus=[
            {
                "index": i,
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
                "command": "python train.py --epochs 90 --batch-size 256",
                "alive": True,
                "gpus": [{"uuid": f"GPU-{n}", "memory_used": GiB, "utilization": 5}],
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
    assert lines[-1].startswith("q quit")


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
