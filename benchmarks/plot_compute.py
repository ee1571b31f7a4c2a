"""Plots of the compute limiter's accuracy from limiter_compute_gpu.py's JSON lines.

  compute-accuracy.png  achieved vs limit per workload (mean of the 1-s windows), one panel per
                        run, with the peers' matmul figures beside ours
  compute-windows.png   the 1-s windows over time per workload and limit: each window where the
                        lines hold them (`windows_pct`), else the band every window lies in
                        (limit ± worst window error), the mean and the first second
  compute-pods.png      pods sharing a GPU: each pod's share against its limit

Lines are grouped into runs by their `run` field, else by the file they came from.
Usage: python benchmarks/plot_compute.py RESULTS.jsonl [...] --out docs/images
(needs matplotlib: `uv sync --group docs`).
"""

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

Record = dict[str, Any]

# The peers on the same kind of machine: one H100 80GB HBM3, driver 580.159.04, CUDA 13.0,
# PyTorch 2.11 (cu130), 2026-11-22; bf16 4096x4096 matmul throughput in % of unlimited, HAMi-core
# at master with its official build flags (source: the comparison table in docs/limiter.md).
PEERS: dict[str, dict[float, tuple[float, float]]] = {  # limit -> (low, high) achieved %
    "HAMi-core": {25: (94, 94), 50: (97, 97)},
    "vgpu-manager's limiter": {25: (84, 87), 50: (98, 98)},
    "NVIDIA MPS (SM share)": {25: (34, 34), 50: (67, 67)},
}
# Two pods capped 30 % and 70 %, run together: vgpu-manager's limiter gives each half of the GPU;
# HAMi-core does not run them concurrently (same source).
PEER_PODS = {"30/70": ("vgpu-manager", [50.0, 50.0])}
TARGET_PP = 3.0  # the project's target: within ± 3 pp of the limit

WORKLOADS = {
    "matmul": "bf16 4096³ matmul",
    "elementwise": "elementwise, ~48 µs kernels",
    "graph": "CUDA graph replay",
    "long": "long kernels, 50 ms",
    "cupy": "CuPy elementwise",
    "triton": "Triton elementwise",
    "jax": "JAX (XLA) elementwise",
}
RUN_TITLES = {
    "boost_correction": "with the daemon (boost correction)",
    "boost_correction_rerun": "with the daemon, re-run",
    "no_boost_correction": "without boost correction",
    "frameworks": "other frameworks' launch paths",
}


class BadInput(Exception):
    """A results file that cannot be read; the message names it."""


def read(paths: Iterable[Path]) -> list[Record]:
    records: list[Record] = []
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except OSError as error:
            raise BadInput(f"{path}: {error.strerror or error}") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise BadInput(f"{path}:{number}: not JSON: {error.msg}") from None
            if not isinstance(record, dict) or "measure" not in record:
                raise BadInput(f"{path}:{number}: not a benchmark line (no 'measure')")
            record.setdefault("run", path.stem)
            records.append(record)
    return records


def _runs(records: list[Record], measure: str) -> dict[str, list[Record]]:
    runs: dict[str, list[Record]] = {}
    for record in records:
        if record["measure"] == measure:
            runs.setdefault(str(record["run"]), []).append(record)
    return runs


def _by_workload(records: list[Record]) -> dict[str, list[Record]]:
    workloads: dict[str, list[Record]] = {}
    for record in records:
        workloads.setdefault(str(record["workload"]), []).append(record)
    for rows in workloads.values():
        rows.sort(key=lambda row: float(row["limit"]))
    return workloads


def _color(workload: str) -> str:
    """One color per workload in every panel."""
    known = list(WORKLOADS)
    position = known.index(workload) if workload in known else len(known)
    return f"C{position % 10}"


def _ideal(axes: Axes, top: float) -> None:
    axes.plot([0, top], [0, top], color="black", linewidth=0.8, label="achieved = limit")
    axes.fill_between(
        [0, top],
        [-TARGET_PP, top - TARGET_PP],
        [TARGET_PP, top + TARGET_PP],
        color="green",
        alpha=0.12,
        label=f"± {TARGET_PP:g} pp",
    )


def plot_accuracy(records: list[Record], out: Path) -> Path | None:
    runs = _runs(records, "single_pod")
    if not runs:
        return None
    columns = min(2, len(runs))
    lines = -(-len(runs) // columns)
    figure, grid = plt.subplots(lines, columns, figsize=(6 * columns, 5 * lines), squeeze=False)
    cells = [axes for row in grid for axes in row]
    for axes in cells[len(runs) :]:
        axes.set_visible(False)
    for axes, (run, rows) in zip(cells, runs.items(), strict=False):
        _ideal(axes, 100)
        for workload, points in _by_workload(rows).items():
            axes.plot(
                [float(p["limit"]) for p in points],
                [float(p["mean_pct"]) for p in points],
                marker="o",
                markersize=4,
                color=_color(workload),
                label=WORKLOADS.get(workload, workload),
            )
        if any(row["workload"] == "matmul" for row in rows):
            for (name, figures), marker in zip(PEERS.items(), "s^D", strict=True):
                limits = sorted(figures)
                low = [figures[limit][0] for limit in limits]
                high = [figures[limit][1] for limit in limits]
                middle = [(a + b) / 2 for a, b in zip(low, high, strict=True)]
                axes.errorbar(
                    limits,
                    middle,
                    yerr=[
                        [m - a for m, a in zip(middle, low, strict=True)],
                        [b - m for m, b in zip(middle, high, strict=True)],
                    ],
                    fmt=marker,
                    color="grey",
                    markerfacecolor="white",
                    capsize=3,
                    label=f"{name}, matmul",
                )
        axes.set(
            title=RUN_TITLES.get(run, run),
            xlabel="compute limit (%)",
            ylabel="throughput, % of unlimited (mean of 1-s windows)",
            xlim=(0, 100),
            ylim=(0, 102),
        )
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="lower right")
    figure.suptitle("Compute limit: achieved against the limit (one H100)")
    return _save(figure, out / "compute-accuracy.png")


def _seconds(rows: list[Record]) -> int:
    lengths = [len(row["windows_pct"]) for row in rows if row.get("windows_pct")]
    return max(lengths, default=10)


def plot_windows(records: list[Record], out: Path, run: str | None) -> Path | None:
    runs = _runs(records, "single_pod")
    if not runs:
        return None
    chosen = run if run is not None else next(iter(runs))
    if chosen not in runs:
        raise BadInput(f"--run {chosen}: no such run (runs: {', '.join(runs)})")
    workloads = _by_workload(runs[chosen])
    columns = min(2, len(workloads))
    rows_count = -(-len(workloads) // columns)
    figure, grid = plt.subplots(
        rows_count, columns, figsize=(6 * columns, 3.6 * rows_count), squeeze=False
    )
    cells = [axes for row in grid for axes in row]
    for axes, (workload, points) in zip(cells, workloads.items(), strict=False):
        seconds = _seconds(points)
        for point, color in zip(
            points, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False
        ):
            limit = float(point["limit"])
            axes.axhline(limit, color=color, linewidth=0.6, linestyle=":")
            windows = point.get("windows_pct")
            if windows:
                time = list(range(1, len(windows) + 1))
                axes.step(time, windows, where="mid", color=color, label=f"L = {limit:g}")
                continue
            worst = point.get("worst_window_error_pp")
            if worst is not None:
                axes.fill_between(
                    [0.5, seconds + 0.5],
                    limit - float(worst),
                    limit + float(worst),
                    color=color,
                    alpha=0.18,
                )
            axes.hlines(
                float(point["mean_pct"]),
                0.5,
                seconds + 0.5,
                color=color,
                linestyle="--",
                label=f"L = {limit:g}: mean {float(point['mean_pct']):g}",
            )
            if point.get("first_second_pct") is not None:
                axes.plot([1], [float(point["first_second_pct"])], "o", color=color)
        axes.set(
            title=WORKLOADS.get(workload, workload),
            xlabel="second of the run",
            ylabel="% of unlimited",
            xlim=(0.5, seconds + 0.5),
            ylim=(0, 100),
        )
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="upper right", ncols=2)
    for axes in cells[len(workloads) :]:
        axes.set_visible(False)
    transcribed = any(not p.get("windows_pct") for p in runs[chosen])
    note = (
        "\nband: every 1-s window lies in it (limit ± worst window); dot: the first second"
        if transcribed
        else ""
    )
    figure.suptitle(f"1-s windows, {RUN_TITLES.get(chosen, chosen)}{note}", fontsize=10)
    return _save(figure, out / "compute-windows.png")


def plot_pods(records: list[Record], out: Path, run: str | None) -> Path | None:
    runs = _runs(records, "pods")
    if not runs:
        return None
    cases = runs[run] if run in runs else next(iter(runs.values()))
    figure, axes = plt.subplots(figsize=(1.8 + 2.6 * len(cases), 4.4))
    positions: list[float] = []
    labels: list[str] = []
    x = 0.0
    for case in cases:
        start = x
        limits = [float(limit) for limit in case["limits"]]
        shares = [float(share) for share in case["mean_pct"]]
        one_pod = str(case["case"]).startswith("one pod")
        targets = [limits[0] / len(limits)] * len(limits) if one_pod else limits
        for number, (share, target) in enumerate(zip(shares, targets, strict=True)):
            bar = axes.bar(x, share, width=0.35, color=f"C{number}")
            axes.hlines(target, x - 0.25, x + 0.25, color="black", linewidth=1.5)
            axes.bar_label(bar, fmt="%.1f", fontsize=7, padding=6)
            positions.append(x)
            who = f"process {number + 1}" if one_pod else f"pod {number + 1}"
            share_of = f"pod limit {limits[0]:g}" if one_pod else f"limit {target:g}"
            labels.append(f"{who}\n{share_of}")
            x += 0.45
        peer = PEER_PODS.get(str(case["case"]))
        if peer is not None:
            name, peer_shares = peer
            for number, share in enumerate(peer_shares):
                axes.bar(x, share, width=0.35, color="lightgrey", hatch="//")
                positions.append(x)
                labels.append(f"{name}\npod {number + 1}")
                x += 0.45
        axes.text((start + x - 0.45) / 2, 94, str(case["case"]), ha="center", fontsize=8)
        x += 0.5
    axes.set_xticks(positions, labels, fontsize=7)
    axes.set(ylabel="share of the GPU's throughput (%)", ylim=(0, 100))
    axes.set_title("Pods sharing one GPU (bars: achieved; black lines: the limits)", fontsize=10)
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, out / "compute-pods.png")


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="JSON lines of the benchmark")
    parser.add_argument("--out", type=Path, required=True, help="folder of the PNG files")
    parser.add_argument(
        "--run", help="the run drawn in the windows and pods plots (default: the first)"
    )
    args = parser.parse_args(argv)
    try:
        records = read(args.results)
        args.out.mkdir(parents=True, exist_ok=True)
        written = [
            plot_accuracy(records, args.out),
            plot_windows(records, args.out, args.run),
            plot_pods(records, args.out, args.run),
        ]
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    made = [str(path) for path in written if path is not None]
    if not made:
        print("error: no single_pod or pods lines in the results", file=sys.stderr)
        return 2
    for path in made:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
