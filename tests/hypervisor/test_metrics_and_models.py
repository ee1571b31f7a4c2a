"""Influx lines and the rotated metrics file; request parsing."""

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from vgpu_common.limits import UNCHANGED, WHOLE_GPU
from vgpu_hypervisor import models
from vgpu_hypervisor.daemon.metrics import MetricsFile, influx_lines
from vgpu_hypervisor.daemon.node import NodeView

UUID = "GPU-5157a1e0-0000-4000-8000-000000000001"


def _view() -> NodeView:
    gpu = models.Gpu(
        index=0,
        uuid=UUID,
        name="NVIDIA H100 80GB HBM3",
        memory_total=80 << 30,
        memory_used=20 << 30,
        utilization=None,
        memory_utilization=None,
        temperature_c=40,
        power_draw_w=None,
        sm_clock_mhz=1980,
        boost=1.125,
        pods=1,
        workers=0,
    )
    pod = models.Pod(
        namespace="team a",
        name="p,1",
        path="/x",
        created=None,
        error=None,
        gpus=[
            models.PodGpu(
                uuid=UUID,
                index=0,
                memory_limit=None,
                memory_used=8 << 30,
                compute_limit=None,
                utilization=None,
            )
        ],
        workers=0,
    )
    return NodeView(taken_at=1_700_000_000.5, snapshot=None, gpus=(gpu,), pods=(pod,))


def test_influx_lines_escape_tags_and_leave_out_what_is_missing() -> None:
    gpu_line, worker_line = influx_lines(_view(), node="node 1")
    assert gpu_line == (
        f"tf_gpu_usage,uuid={UUID},node=node\\ 1 memory_bytes={20 << 30}i,"
        "memory_percentage=25.0,temperature=40.0,sm_clock_mhz=1980.0,boost=1.125 "
        "1700000000500000000\n"
    )
    assert worker_line.startswith(
        f"tf_worker_usage,uuid={UUID},node=node\\ 1,namespace=team\\ a,worker=p\\,1,workload=p\\,1 "
    )
    assert f"memory_bytes={8 << 30}i" in worker_line and "compute_percentage" not in worker_line
    assert "memory_percentage=10.0" in worker_line and "host_memory_bytes" not in worker_line


def test_a_tag_with_a_newline_stays_on_its_line() -> None:
    """A tenant writes its region's UUIDs: one with a newline added a line of its own."""
    view = _view()
    share = view.pods[0].gpus[0].model_copy(update={"uuid": "GPU-1\ntf_gpu,uuid=x m=1i"})
    pod = view.pods[0].model_copy(update={"gpus": [share]})
    lines = influx_lines(NodeView(view.taken_at, None, view.gpus, (pod,)))
    assert all(line.count("\n") == 1 and line.endswith("\n") for line in lines)
    assert "uuid=GPU-1\\ tf_gpu\\,uuid\\=x\\ m\\=1i," in lines[1]


def test_a_count_past_what_influx_holds_stays_a_line_influx_reads() -> None:
    """A tenant writes its region's usage words: a memory_used of 2**64 - 1 went out as
    `memory_bytes=18446744073709551615i`, past the signed 64 bits of an influx integer, and the
    reader refused the line ("value out of range")."""
    view = _view()
    scribbled = {"memory_used": (1 << 64) - 1, "host_memory_used": 1 << 63}
    share = view.pods[0].gpus[0].model_copy(update=scribbled)
    pod = view.pods[0].model_copy(update={"gpus": [share]})
    _, worker_line = influx_lines(NodeView(view.taken_at, None, view.gpus, (pod,)))
    integers = [
        int(value) for value in re.findall(r"(?<=[ ,])\w+=(-?[0-9]+)i(?=[ ,])", worker_line)
    ]
    assert len(integers) == 2 and all(-(1 << 63) <= value < 1 << 63 for value in integers)


def test_influx_lines_carry_host_backed_memory_of_an_oversubscribed_pod() -> None:
    view = _view()
    share = view.pods[0].gpus[0].model_copy(update={"host_memory_used": 3 << 30})
    pod = view.pods[0].model_copy(update={"gpus": [share]})
    _, worker_line = influx_lines(NodeView(view.taken_at, None, view.gpus, (pod,)))
    assert f"host_memory_bytes={3 << 30}i" in worker_line


def test_the_metrics_file_rotates(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "metrics.influx"
    metrics = MetricsFile(path, rotate_bytes=100)
    metrics.write(["a" * 60 + "\n"])
    metrics.write(["b" * 30 + "\n"])
    assert path.read_text() == "a" * 60 + "\n" + "b" * 30 + "\n"
    metrics.write(["c" * 30 + "\n"])  # would pass 100 bytes: rotate first
    assert path.read_text() == "c" * 30 + "\n"
    assert path.with_name("metrics.influx.1").read_text().startswith("a" * 60)
    metrics.write([])
    assert path.read_text() == "c" * 30 + "\n"


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (None, UNCHANGED),
        (0, None),
        ("none", None),
        ("4GiB", 4 << 30),
        (1024, 1024),
        ("1.5KiB", 1536),
    ],
)
def test_memory_values(memory: object, expected: object) -> None:
    assert models.GpuLimitsRequest.model_validate({"memory": memory}).memory == expected


@given(st.one_of(st.text(max_size=20), st.floats(), st.integers(), st.booleans(), st.none()))
def test_compute_values_are_a_percentage_or_an_error(value: object) -> None:
    try:
        parsed = models.GpuLimitsRequest.model_validate({"compute": value}).limits().compute
    except ValidationError as error:
        (problem,) = error.errors()
        assert "percent" in problem["msg"]
        return
    assert parsed in (None, UNCHANGED) or (isinstance(parsed, int) and 1 <= parsed < WHOLE_GPU)
