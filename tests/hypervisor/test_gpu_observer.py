"""The GPU observer on the simulated GPU, and on the NVIDIA driver where there is one.

The simulated NVML maps its node state once per process, so each check runs in a fresh Python
process (``scenario``) on its own node, and prints what it saw as one JSON line.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from vgpu_limiter import sim

GiB = 1 << 30
MiB = 1 << 20
CONTEXT_OVERHEAD = 512 * MiB  # the simulator's default per-process context cost
A100_UUID = "GPU-a100a100-0000-4000-8000-00000000000a"
DEVICES = f"name=NVIDIA A100-SXM4-40GB,memory=40GiB,uuid={A100_UUID};count=2,memory=80GiB"

PRELUDE = """
import asyncio, ctypes, json, os, subprocess, sys, time
from pathlib import Path
from vgpu_limiter import sim
from vgpu_hypervisor.gpu import GpuBackendError, GpuObserver, NOT_AVAILABLE
from vgpu_hypervisor.gpu import nvml

STATE = Path(os.environ["GPU_TEST_STATE"])

def emit(value):
    print(json.dumps(value), flush=True)

def failure(call):
    try:
        call()
    except GpuBackendError as error:
        return str(error)
    return None
"""


class Outcome:
    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        assert result.returncode == 0, result.stderr
        self.value: Any = json.loads(result.stdout.splitlines()[-1])
        self.stderr = result.stderr


def without_simulator_path(value: str) -> str:
    folder = str(sim.library_dir())
    return ":".join(part for part in value.split(":") if part and part != folder)


@pytest.fixture
def node(tmp_path: Path) -> dict[str, str]:
    """An environment for a scenario on a fresh simulated node with DEVICES, no driver path."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_SIM_", "TF_"))}
    base["LD_LIBRARY_PATH"] = without_simulator_path(base.get("LD_LIBRARY_PATH", ""))
    return base | {"GPU_TEST_STATE": str(tmp_path / "node.state"), "VGPU_SIM_DEVICES": DEVICES}


def scenario(environment: dict[str, str], body: str, timeout: float = 60) -> Outcome:
    script = PRELUDE + textwrap.dedent(body)
    return Outcome(
        subprocess.run(
            [sys.executable, "-c", script],
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    )


def test_forced_simulation_lists_the_devices_with_names_uuids_and_memory(
    node: dict[str, str],
) -> None:
    seen = scenario(
        node,
        """
        with GpuObserver.open(simulate=True, sim_state=STATE) as observer:
            info = observer.backend
            emit({"info": info.to_dict(), "line": info.describe(),
                  "snapshot": observer.sample().to_dict()})
        """,
    ).value
    info, snapshot = seen["info"], seen["snapshot"]
    assert info["backend"] == snapshot["backend"] == "simulated"
    assert info["reason"] == "requested"
    assert info["sim_state"] == node["GPU_TEST_STATE"]
    assert Path(info["library"]) == sim.library_dir().resolve() / "libnvidia-ml.so.1"
    assert (info["device_count"], info["driver_version"], info["cuda_version"]) == (
        3,
        "580.95.05",
        "13.0",
    )
    assert seen["line"].startswith("GPU backend: simulated GPU (requested): 3 devices, driver ")
    assert "\n" not in seen["line"] and node["GPU_TEST_STATE"] in seen["line"]

    devices = snapshot["devices"]
    assert [d["index"] for d in devices] == [0, 1, 2]
    assert [d["name"] for d in devices] == ["NVIDIA A100-SXM4-40GB"] + ["NVIDIA H100 80GB HBM3"] * 2
    assert devices[0]["uuid"] == A100_UUID
    assert len({d["uuid"] for d in devices}) == 3
    assert [d["memory_total"] for d in devices] == [40 * GiB, 80 * GiB, 80 * GiB]
    assert all(d["memory_used"] == 0 for d in devices)
    assert all(d["processes"] == [] and d["process_utilization"] == [] for d in devices)


def test_the_simulator_answers_every_query_of_a_pass(node: dict[str, str]) -> None:
    # A pass reads only what the daemon shows or exports; the simulated NVML has all of it but
    # NVML events (XID errors), which the tolerant layer reports as not available.
    passes = scenario(
        node,
        """
        with GpuObserver.open(simulate=True, sim_state=STATE) as observer:
            emit([observer.sample().to_dict() for _ in range(3)])
        """,
    ).value
    for snapshot in passes:
        assert len(snapshot["devices"]) == 3
        for device in snapshot["devices"]:
            assert [key for key, value in device.items() if value is None] == ["xid_errors"]
            assert device["temperature_c"] > 0 and device["power_draw_mw"] > 0
            assert device["sm_clock_mhz"] > 0 and device["memory_clock_mhz"] > 0
            assert device["energy_mj"] > 0 and device["memory_free"] > 0
            assert device["pci_bus_id"] and device["minor_number"] == device["index"]


# A workload that allocates 1 GiB and runs kernels for 3 s, then holds its memory idle.
WORKLOAD = """
environment = os.environ | sim.environment(state=STATE)
command = [str(sim.workload_path()), "--alloc", "1GiB", "--duration", "3", "--kernel-us", "2000",
           "--hold", "5"]

def until(condition, observer, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = observer.sample()
        if condition(snapshot.devices[0]):
            return snapshot.devices[0]
        time.sleep(0.1)
    raise SystemExit("timed out: " + json.dumps(snapshot.to_dict()))
"""


def test_a_workload_shows_up_with_its_memory_and_new_utilization_samples(
    node: dict[str, str],
) -> None:
    seen = scenario(
        node,
        WORKLOAD
        + """
with GpuObserver.open(simulate=True, sim_state=STATE) as observer:
    workload = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True)
    pid = workload.pid
    mine = lambda samples: [s for s in samples if s.pid == pid]
    running = until(lambda d: mine(d.process_utilization), observer)
    busy = [running]
    for _ in range(3):  # passes while it runs: each gives a newer sample, or none
        time.sleep(0.2)
        busy.append(observer.sample().devices[0])
    report = json.loads(workload.stdout.readline())  # the kernels are done, the memory held
    idle = until(lambda d: d.process_utilization == (), observer)
    workload.terminate()
    workload.wait()
    gone = until(lambda d: d.processes == (), observer)
    emit({"pid": pid, "report": report, "busy": [d.to_dict() for d in busy],
          "idle": idle.to_dict(), "gone": gone.to_dict()})
""",
    ).value
    pid, report = seen["pid"], seen["report"]
    assert report["pid"] == pid and report["allocated_bytes"] == GiB

    first = seen["busy"][0]
    assert [p["pid"] for p in first["processes"]] == [pid]
    assert first["processes"][0]["used_memory"] == GiB + CONTEXT_OVERHEAD
    assert first["memory_used"] == GiB + CONTEXT_OVERHEAD
    stamps = []
    for device in seen["busy"]:
        samples = device["process_utilization"]
        assert [s["pid"] for s in samples] in ([pid], [])
        stamps += [s["timestamp_us"] for s in samples]
        assert all(1 <= s["sm_utilization"] <= 100 for s in samples)
    assert len(stamps) >= 3 and stamps == sorted(set(stamps))  # every sample is a new one
    assert seen["busy"][-1]["gpu_utilization"] > 0

    # Holding memory without running kernels: listed with its memory, no utilization sample.
    assert seen["idle"]["process_utilization"] == []
    assert [p["pid"] for p in seen["idle"]["processes"]] == [pid]
    assert seen["gone"]["memory_used"] == 0


def test_the_async_sampler_leaves_the_event_loop_free(node: dict[str, str]) -> None:
    # Each device's memory query is made to take 0.2 s: a pass over 3 devices takes 0.6 s,
    # during which the loop keeps ticking.
    seen = scenario(
        node,
        """
        query = nvml.device_memory
        def slow(handle):
            time.sleep(0.2)
            return query(handle)

        async def main():
            ticks = 0
            async def tick():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1
            with GpuObserver.open(simulate=True, sim_state=STATE) as observer:
                ticker = asyncio.create_task(tick())
                nvml.device_memory = slow
                snapshot = await observer.sample_async()
                during = ticks
                nvml.device_memory = query
                together = await asyncio.gather(*(observer.sample_async() for _ in range(8)))
                watched = []
                async for later in observer.watch(0.05):
                    watched.append(later.taken_at)
                    if len(watched) == 3:
                        break
                ticker.cancel()
            return {"during": during, "duration": snapshot.duration,
                    "memory": [d.memory_total for d in snapshot.devices],
                    "together": [len(s.devices) for s in together], "watched": watched}

        emit(asyncio.run(main()))
        """,
    ).value
    assert seen["duration"] >= 0.6
    assert seen["during"] >= 20  # ~60 at 10 ms, far from 0 for a blocked loop
    assert seen["memory"] == [40 * GiB, 80 * GiB, 80 * GiB]
    assert seen["together"] == [3] * 8
    watched = seen["watched"]
    assert watched == sorted(watched) and watched[2] - watched[0] >= 0.09


def test_auto_mode_names_the_simulated_library_found_by_soname(node: dict[str, str]) -> None:
    environment = node | sim.environment(state=node["GPU_TEST_STATE"], base=node)
    info = scenario(
        environment,
        """
        with GpuObserver.open() as observer:
            emit(observer.backend.to_dict())
        """,
    ).value
    assert info["backend"] == "simulated"
    assert info["reason"] == "libnvidia-ml.so.1 found"
    assert info["sim_state"] == node["GPU_TEST_STATE"]  # from VGPU_SIM_STATE


def test_without_a_driver_auto_mode_falls_back_to_the_simulated_gpu(node: dict[str, str]) -> None:
    seen = scenario(
        node,
        """
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
            emit({"driver": True})
            raise SystemExit(0)
        except OSError:
            pass
        refused = failure(lambda: GpuObserver.open(simulate=False))
        with GpuObserver.open(sim_state=STATE) as observer:
            emit({"refused": refused, "info": observer.backend.to_dict(),
                  "line": observer.backend.describe()})
        """,
    ).value
    if seen.get("driver"):
        pytest.skip("an NVIDIA driver is installed here")
    assert seen["refused"] == "no NVIDIA driver: libnvidia-ml.so.1 not found"
    assert seen["info"]["backend"] == "simulated"
    assert seen["info"]["reason"] == "no NVIDIA driver: libnvidia-ml.so.1 not found"
    assert seen["line"].startswith(
        "GPU backend: simulated GPU (no NVIDIA driver: libnvidia-ml.so.1 not found): 3 devices"
    )


def test_a_bad_state_file_is_one_clear_error(node: dict[str, str], tmp_path: Path) -> None:
    Path(node["GPU_TEST_STATE"]).write_bytes(b"not a simulator state\n" * 100_000)
    outcome = scenario(
        node,
        """
        emit([failure(lambda: GpuObserver.open(simulate=True, sim_state=STATE)) for _ in range(2)])
        """,
    )
    expected = (
        f"simulated GPU: VGPU_SIM_STATE={node['GPU_TEST_STATE']}: "
        "not a state file of this simulator version; remove it"
    )
    assert outcome.value == [expected, expected]  # the library does not try twice: same reason
    assert "vgpu simulated GPU" not in outcome.stderr  # said once, in the error


def test_a_state_file_that_cannot_be_created_is_one_clear_error(
    node: dict[str, str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-folder" / "node.state"
    message = scenario(
        node | {"GPU_TEST_STATE": str(missing)},
        """
        emit(failure(lambda: GpuObserver.open(simulate=True, sim_state=STATE)))
        """,
    ).value
    assert message.startswith(f"simulated GPU: VGPU_SIM_STATE={missing}: cannot create: ")
    assert "\n" not in message


def test_one_node_state_per_process_and_clean_lifetimes(
    node: dict[str, str], tmp_path: Path
) -> None:
    seen = scenario(
        node | {"OTHER_STATE": str(tmp_path / "other.state")},
        """
        first = GpuObserver.open(simulate=True, sim_state=STATE)
        second = GpuObserver.open(simulate=True, sim_state=STATE)  # the same node: fine
        other_state = Path(os.environ["OTHER_STATE"])
        other = failure(lambda: GpuObserver.open(simulate=True, sim_state=other_state))
        first.close()
        first.close()
        devices = len(second.sample().devices)  # still initialized for the second
        second.close()
        closed = failure(first.sample)
        missing = failure(lambda: GpuObserver.open(library=Path("/nonexistent/libnvidia-ml.so.1")))
        with GpuObserver.open(library=sim.library_dir() / "libnvidia-ml.so.1") as observer:
            given = observer.backend.to_dict()
        emit({"other": other, "devices": devices, "closed": closed, "missing": missing,
              "given": given})
        """,
    ).value
    assert seen["other"] == (
        f"this process's simulated GPU already uses {node['GPU_TEST_STATE']}, "
        f"not {tmp_path / 'other.state'}"
    )
    assert seen["devices"] == 3
    assert seen["closed"] == "the GPU observer is closed"
    assert seen["missing"].startswith("cannot load /nonexistent/libnvidia-ml.so.1: ")
    assert seen["given"]["backend"] == "simulated"
    assert seen["given"]["reason"].startswith("library ") and seen["given"]["reason"].endswith(
        " given"
    )


@pytest.mark.gpu
def test_on_a_real_gpu_the_driver_is_found_and_sampled(node: dict[str, str]) -> None:
    seen = scenario(
        node,
        """
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            emit({"driver": False})
            raise SystemExit(0)
        with GpuObserver.open() as observer:
            passes = [observer.sample().to_dict() for _ in range(2)]
            emit({"driver": True, "info": observer.backend.to_dict(), "passes": passes,
                  "line": observer.backend.describe()})
        """,
    ).value
    if not seen["driver"]:
        pytest.skip("no NVIDIA driver here")
    info = seen["info"]
    assert info["backend"] == "nvml" and info["reason"] == "libnvidia-ml.so.1 found"
    assert info["device_count"] >= 1 and info["sim_state"] is None
    assert info["driver_version"] and info["cuda_version"]
    assert seen["line"].startswith("GPU backend: NVIDIA driver (libnvidia-ml.so.1 found): ")
    for snapshot in seen["passes"]:
        assert snapshot["backend"] == "nvml"
        assert len(snapshot["devices"]) == info["device_count"]
        for device in snapshot["devices"]:
            for field in ("uuid", "name", "memory_total", "memory_used"):
                assert device[field] is not None, (field, device)
            assert device["uuid"].startswith(("GPU-", "MIG-"))
