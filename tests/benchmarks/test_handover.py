"""benchmarks/handover_gpu.py reads where a shared GPU's time went from each pod's matmul intervals
on the GPU's clock: hand-overs between pods, a pod's own gaps, idle time, and pods running at once
(the GPU time-slicing them), even when a bracket spans a wait of the program in the limiter."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "handover_gpu.py"
US = 1_000
MATMUL = 200 * US


@pytest.fixture(scope="module")
def handover() -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("handover_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def turns(pattern: list[tuple[int, int, int]], seconds: float) -> list[Any]:
    """Intervals of back-to-back matmuls in turns: (pod, matmuls, gap in ns before the next turn),
    repeated for `seconds`."""
    intervals: list[list[tuple[int, int]]] = [[] for _ in {pod for pod, _, _ in pattern}]
    t = 0
    while t < seconds * 1e9:
        for pod, matmuls, gap in pattern:
            for _ in range(matmuls):
                intervals[pod].append((t, t + MATMUL))
                t += MATMUL
            t += gap
    return [numpy.array(iv, dtype=numpy.uint64) for iv in intervals]


def test_hand_overs_and_idle_time_are_told_apart(handover: ModuleType) -> None:
    # 16 matmuls of pod 0, 300 µs to hand over, 8 of pod 1, 2 ms with nothing running.
    found = handover.analyse(turns([(0, 16, 300 * US), (1, 8, 2_000 * US)], 3.0))
    cycle = 24 * MATMUL + 2_300 * US
    assert found["handover_us_p50"] == pytest.approx(300, abs=1)
    assert found["handovers_per_s"] == pytest.approx(1e9 / cycle, rel=0.05)
    assert found["handover"] == pytest.approx(100 * 300 * US / cycle, rel=0.05)
    assert found["idle"] == pytest.approx(100 * 2_000 * US / cycle, rel=0.05)
    assert found["own"] < 0.1 and found["overlap"] == 0  # at most the gap the window opens in
    assert found["busy"] == pytest.approx(100 * 24 * MATMUL / cycle, rel=0.01)
    assert found["matmuls_per_s"][0] == pytest.approx(2 * found["matmuls_per_s"][1], rel=0.05)


def test_a_pods_own_gaps_are_not_hand_overs(handover: ModuleType) -> None:
    found = handover.analyse(turns([(0, 40, 150 * US)], 2.0))
    assert found["handovers_per_s"] == 0
    assert found["own"] == pytest.approx(100 * 150 / (40 * 200 + 150), rel=0.05)


def test_pods_time_sliced_by_the_gpu_overlap(handover: ModuleType) -> None:
    # Two unlimited loops: each bracket spans the other's slice of the GPU.
    slices = []
    for pod in (0, 1):
        starts = numpy.arange(0, 2 * 10**9, 4_000 * US, dtype=numpy.int64) + pod * 2_000 * US
        slices.append(numpy.column_stack([starts, starts + 2_100 * US]).astype(numpy.uint64))
    found = handover.analyse(slices)
    assert found["overlap"] > 0


def test_a_bracket_across_a_wait_in_the_limiter_is_not_overlap(handover: ModuleType) -> None:
    pods = turns([(0, 16, 300 * US), (1, 8, 300 * US)], 2.0)
    # Pod 0's last matmul of each turn: its closing stamp was launched after the pod's wait for
    # its next turn, so the bracket spans pod 1's turn.
    stretched = pods[0].copy()
    last = numpy.arange(15, len(stretched) - 16, 16)
    stretched[last, 1] = stretched[last + 1, 0] - 100 * US
    found = handover.analyse([stretched, pods[1]])
    assert found["overlap"] == 0
    assert found["handover_us_p50"] == pytest.approx(300, abs=1)


def test_a_set_names_each_pods_limit_and_soft_limit(handover: ModuleType) -> None:
    assert handover.parse_set("30:100,70") == [(30, 100), (70, 0)]
    with pytest.raises(SystemExit, match="30:x"):
        handover.parse_set("30:x,70")
