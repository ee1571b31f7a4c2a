"""benchmarks/plot_compute.py draws the docs' plots from the benchmark's JSON lines: the
transcribed H100 figures, lines with per-window series as the benchmark prints them, and a
one-line error for a file it cannot read."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "plot_compute.py"
FIXTURE = ROOT / "benchmarks" / "results" / "limiter_compute_h100.jsonl"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plotter() -> ModuleType:
    """The script as a module: one matplotlib import for the cases that need no new process."""
    spec = importlib.util.spec_from_file_location("plot_compute", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_docs_plots_come_from_the_transcribed_figures(tmp_path: Path) -> None:
    done = plot(str(FIXTURE), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    names = ["compute-accuracy.png", "compute-windows.png", "compute-pods.png"]
    assert done.stdout.split() == [str(tmp_path / name) for name in names]
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
        # the docs show these very files
        assert (ROOT / "docs" / "images" / name).is_file()
        assert f"images/{name}" in (ROOT / "docs" / "limiter.md").read_text()


def test_the_fixture_restates_the_docs_tables() -> None:
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    docs = (ROOT / "docs" / "limiter.md").read_text()
    for record in records:
        assert record["source"].startswith("docs/limiter.md: ")
        figures = record["mean_pct"] if record["measure"] == "pods" else [record["mean_pct"]]
        for figure in figures:
            assert f"{figure:.2f}" in docs or f"{figure:.1f}" in docs, record


def test_benchmark_lines_with_windows_are_drawn_window_by_window(
    tmp_path: Path, plotter: ModuleType
) -> None:
    # What limiter_compute_gpu.py prints, without a `run` field: the file names the run.
    lines = [
        {"measure": "baseline", "workload": "matmul", "per_second": 660.0, "windows": [660.0]},
        *(
            {
                "measure": "single_pod",
                "workload": "matmul",
                "limit": limit,
                "mean_pct": limit + 0.5,
                "mean_error_pp": 0.5,
                "first_second_pct": limit + 2,
                "worst_window_error_pp": 2.0,
                "windows_pct": [limit + 2, limit, limit + 1, limit - 1, limit + 0.5],
            }
            for limit in (25, 50)
        ),
    ]
    results = tmp_path / "run.jsonl"
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert plotter.main([str(results), "--out", str(tmp_path / "out"), "--run", "run"]) == 0
    # no pods lines: no pods plot
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "compute-accuracy.png",
        "compute-windows.png",
    ]


def test_bad_input_is_one_line_naming_it(
    tmp_path: Path, plotter: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    def error(*args: str) -> str:
        assert plotter.main(list(args)) == 2
        return capsys.readouterr().err

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"measure": "single_pod"}\nnot json\n')
    assert error(str(broken), "--out", str(tmp_path)) == (
        f"error: {broken}:2: not JSON: Expecting value\n"
    )
    assert error(str(FIXTURE), "--out", str(tmp_path), "--run", "nonesuch").startswith(
        "error: --run nonesuch: no such run (runs: boost_correction,"
    )
    missing = tmp_path / "missing.jsonl"
    assert error(str(missing), "--out", str(tmp_path)) == (
        f"error: {missing}: No such file or directory\n"
    )
    empty = tmp_path / "baseline.jsonl"
    empty.write_text('{"measure": "baseline", "workload": "matmul"}\n')
    assert error(str(empty), "--out", str(tmp_path)) == (
        "error: no single_pod or pods lines in the results\n"
    )
