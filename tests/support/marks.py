"""The simulated workload's --marks report: [seconds since start, kernels finished so far]."""

import itertools


def per_second(marks: list[list[float]], seconds: int) -> list[float]:
    """Kernels finished in each whole second, interpolated between the program's marks."""
    points = [(0.0, 0.0), *((float(t), float(done)) for t, done in marks)]

    def done_at(t: float) -> float:
        for (t0, d0), (t1, d1) in itertools.pairwise(points):
            if t1 >= t:
                return d0 + (d1 - d0) * (t - t0) / (t1 - t0) if t1 > t0 else d1
        return points[-1][1]

    return [done_at(k + 1) - done_at(k) for k in range(seconds)]
