"""`pods describe`: one pod in full, as `kubectl describe` lays things out (label: value)."""

import time
from typing import Any

from vgpu_common.limits import format_bytes, format_percent, format_size
from vgpu_common.visible import visible

NA = "-"


def _when(stamp: float | None, now: float) -> str:
    if stamp is None:
        return NA
    text = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(stamp))
    return f"{text} ({_ago(now - stamp)} ago)"


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _utilization(gpu: dict[str, Any]) -> str:
    utilization = gpu.get("utilization")
    return NA if utilization is None else format_percent(utilization)


def region_flags(path: str | None) -> str:
    """The region's flags (frozen, deleted), read from the file where this node can open it;
    the API does not carry them."""
    if not path:
        return NA
    from vgpu_limiter import region as regions

    try:
        with regions.open_region(path, writable=False) as region:
            flags = region.flags
    except (OSError, ValueError, regions.RegionError) as error:
        return f"- (the region cannot be read here: {error})"
    names = [
        name
        for name, bit in (("frozen", regions.FLAG_FROZEN), ("deleted", regions.FLAG_DELETED))
        if flags & bit
    ]
    return ", ".join(names) or "none"


def describe_pod(pod: dict[str, Any], now: float | None = None) -> str:
    """The text of `pods describe` for a pod document with its ``worker_list``."""
    now = time.time() if now is None else now
    lines = [
        f"Name:       {pod['name']}",
        f"Namespace:  {pod['namespace']}",
        f"Created:    {_when(pod.get('created'), now)}",
        f"Region:     {pod.get('path') or NA}",
        f"Status:     {'error: ' + pod['error'] if pod.get('error') else 'ok'}",
        f"Flags:      {region_flags(pod.get('path'))}",
        f"QoS:        {pod.get('qos', 'medium')} (weight {pod.get('weight', 2)})",
        f"Workers:    {pod.get('workers', 0)}",
        "GPUs:",
    ]
    for gpu in pod.get("gpus") or []:
        index = gpu.get("index")
        limit = gpu.get("memory_limit")
        compute = gpu.get("compute_limit")
        burst = gpu.get("compute_burst")
        refused = gpu.get("last_refused_bytes")
        lines += [
            f"  GPU {index if index is not None else '(not on this node)'}  {gpu['uuid']}",
            f"    Memory limit:   {format_size(limit) if limit else 'none'}",
            f"    Memory used:    {format_bytes(gpu.get('memory_used') or 0)}",
            f"    Oversubscribe:  {'on' if gpu.get('oversubscribe') else 'off'}"
            f" ({format_bytes(gpu.get('host_memory_used') or 0)} in host memory)",
            f"    Compute limit:  {format_percent(compute) if compute else 'none'}",
            f"    Burst limit:    {format_percent(burst) if burst else 'none'}",
            f"    Held to:        {_held_to(gpu.get('compute_effective'))}",
            f"    Frozen:         {'yes' if gpu.get('frozen') else 'no'}",
            f"    Utilization:    {_utilization(gpu)}",
            f"    GPU time:       {gpu.get('gpu_seconds', 0):.1f} s"
            f" ({gpu.get('burst_seconds', 0):.1f} s above the limit)",
            f"    Throttled:      {gpu.get('throttled_seconds', 0):.1f} s",
            f"    OOM refusals:   {gpu.get('oom_refusals', 0)}"
            + (f" (last asked for {format_bytes(refused)})" if refused else ""),
        ]
    if not pod.get("gpus"):
        lines.append("  (none)")
    workers = pod.get("worker_list") or []
    lines.append("Worker processes:" if workers else "Worker processes: (none)")
    for worker in workers:
        host = worker.get("host_pid")
        state = "running" if worker.get("alive", True) else "exited"
        lines += [
            f"  PID {worker['pid']} (host {host if host is not None else NA}, slot "
            f"{worker.get('slot', NA)}), {state}: {worker.get('command') or NA}",
            f"    Started:        {_when(worker.get('started'), now)}",
            f"    Last GPU call:  {_when(worker.get('last_gpu_call'), now)}",
        ]
        for gpu in worker.get("gpus") or []:
            lines.append(
                f"    {gpu['uuid']}: {format_bytes(gpu.get('memory_used') or 0)},"
                f" util {_utilization(gpu)}"
            )
    # Names, paths, errors and command lines are tenants' text: each line escaped whole, so no
    # escape sequence reaches the terminal and no newline starts a line of a tenant's making.
    return "\n".join(visible(line) for line in lines) + "\n"


def _held_to(effective: float | None) -> str:
    """What the daemon holds the pod to on a GPU it divides (its effective limit)."""
    if not effective:
        return "its own limit"
    return f"{format_percent(effective)} (the GPU divided among the pods that want it)"
