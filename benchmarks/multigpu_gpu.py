"""Multi-GPU behaviour on a node of two or more real GPUs, each result printed as one JSON line.

The node daemon runs throughout; pods are made through its API as `tf-hypervisor pods create`
makes them, and their programs (benchmarks/multigpu_programs.py, PyTorch) run with the library
preloaded and the pod named (POD_NAMESPACE, POD_NAME), as the daemon's pods are used.
  confine   two pods, one per GPU (GPU 0: 8 GiB / 30 %, GPU 1: 4 GiB / 60 %): what each sees
            (torch with every GPU visible and with CUDA_VISIBLE_DEVICES set to its GPU as
            `tf-limiter run --pod` sets it; nvidia-smi under the library), the memory it can
            allocate, and its compute share, both pods running at once
  pergpu    one pod on two GPUs with those limits: each GPU's memory and compute limit alone
  ddp       a 2-process DDP (NCCL) training job, unlimited and then in a pod of 8 GiB / 50 % on
            each GPU: the loss after the same steps, the throughput ratio, and the memory the
            pod is charged on each GPU beside what NVML sees the job use
  ddp_pair  two such jobs at once in pods of 30 % and 70 % on both GPUs: their shares
The DDP cases also report what the limiter's pacing did in the limited runs ("pacing", from its
debug log): the collective kernels it recognised, the epochs it ended to pause the ranks together
before a collective, and the epochs whose work did not finish within the wait limit.
  ipc       one process of a pod allocates 1 GiB and a second opens it by CUDA IPC: the pod's
            charge (the memory once, one context charge per process)
Shares are work per second over the same program's unlimited rate alone on the same GPU.
Usage: python benchmarks/multigpu_gpu.py --library path/to/libcuda_limiter.so [--only …]
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import limiter_compute_gpu as gpu

PROGRAMS = Path(__file__).resolve().parent / "multigpu_programs.py"
NAMESPACE = "bench"
GiB, MiB = 1 << 30, 1 << 20
TOLERANCE_POINTS = 3.0
CONTEXT_CHARGE = 544 * MiB  # the daemon's default, given explicitly: the checks count on it


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def pacing_log(node: "Node", name: str) -> dict[str, str]:
    """The environment that has a pod's limiter log its pacing to a file of the run's own."""
    return {"TF_LOG_LEVEL": "debug", "TF_LOG_PATH": str(node.work / f"{name}-limiter.log")}


def pacing_summary(node: "Node", name: str) -> dict[str, Any]:
    """What the limiter's debug log of `name`'s runs says its pacing did."""
    path = node.work / f"{name}-limiter.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    kernels = sorted(set(re.findall(r"collective kernel (\S+):", text)))
    return {
        "collective_kernels": [k[:60] for k in kernels[:5]],
        "collective_kernel_count": len(kernels),
        "epochs_ended_for_a_collective": sum(map(int, re.findall(r"(\d+) for a collective", text))),
        "epochs_past_the_wait_limit": text.count("did not finish in"),
        # All ranks' waits, summed: for other pods' epochs, and of that for the pod's own other
        # ranks (a rank that got its lease waits for theirs, so that all start together).
        "lease_wait_ms": round(
            sum(map(int, re.findall(r"(\d+) us waited for the lease", text))) / 1e3
        ),
        "gang_start_wait_ms": round(
            sum(map(int, re.findall(r"(\d+) us of it for the gang's other ranks", text))) / 1e3
        ),
        "per_process": pacing_per_process(text),
    }


PACING_LINE = re.compile(
    r"vgpu-limiter\[(\d+)\]: \w+: pacing: .*?(\d+) us of GPU time charged, (\d+) us waited for "
    r"the lease.*?, (\d+) us paused for the limit, (\d+) us beyond the bucket's cap in (\d+) ms"
)


def pacing_per_process(text: str) -> dict[str, dict[str, float]]:
    """Each process's pacing over its logged seconds, as percentages of that time: where the
    time went that its share did not get (paused for its own limit, waited for other pods, or
    cut off by its bucket's cap)."""
    sums: dict[str, list[int]] = {}
    for match in PACING_LINE.finditer(text):
        pid, *values = match.groups()
        total = sums.setdefault(pid, [0, 0, 0, 0, 0])
        for i, value in enumerate(values):
            total[i] += int(value)
    report: dict[str, dict[str, float]] = {}
    for pid, (charged, waited, paused, capped, ms) in sums.items():
        if ms > 0:
            report[pid] = {
                "seconds": round(ms / 1e3, 1),
                "charged_pct": round(charged / (10 * ms), 1),
                "lease_wait_pct": round(waited / (10 * ms), 1),
                "paused_pct": round(paused / (10 * ms), 1),
                "capped_pct": round(capped / (10 * ms), 1),
            }
    return report


def last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            report: dict[str, Any] = json.loads(line)
            return report
    raise RuntimeError(f"no report in the output: {text[-800:]}")


class Node:
    def __init__(self, library: str, seconds: int) -> None:
        self.library = library
        self.seconds = seconds
        self.work = Path(tempfile.mkdtemp(prefix="vgpu-multigpu-"))
        self.base = self.work / "base"
        self.plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.plain.pop("CUDA_VISIBLE_DEVICES", None)
        self.charge = CONTEXT_CHARGE
        self.daemon = gpu.start_daemon(
            self.work, self.base, self.plain, ["--context-charge", str(CONTEXT_CHARGE)]
        )
        rows = self.smi("--query-gpu=index,uuid,name,memory.total", self.plain)
        self.uuids = [row[1] for row in rows]
        self.names = [row[2] for row in rows]
        if len(self.uuids) < 2:
            raise SystemExit(f"this benchmark needs two GPUs; the node has {len(self.uuids)}")
        self.unlimited_matmul: list[float] | None = None
        self.unlimited_ddp: dict[str, Any] | None = None
        emit({"measure": "node", "gpus": [row[1:] for row in rows], "context_charge": self.charge})

    # --- the daemon, the pods and their programs ---------------------------------------------

    def api(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            self.daemon.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.daemon.token_file.read_text().strip()}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def create(self, name: str, gpus: dict[str, dict[str, Any]]) -> None:
        self.api("POST", "/pods", {"name": name, "namespace": NAMESPACE, "gpus": gpus})

    def charged(self, name: str) -> dict[int, int]:
        """The pod's memory in use by GPU index, as the daemon reports it."""
        pod = self.api("GET", f"/pods/{NAMESPACE}/{name}")
        return {g["index"]: g["memory_used"] for g in pod["gpus"]}

    def env(self, pod: str, visible: str | None = None) -> dict[str, str]:
        env = self.plain | {
            "LD_PRELOAD": self.library,
            "SHM_BASE_PATH": str(self.base),
            "POD_NAMESPACE": NAMESPACE,
            "POD_NAME": pod,
        }
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        return env

    def program(self, env: dict[str, str], *args: str, timeout: float = 300) -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, str(PROGRAMS), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            return {"failed": result.returncode, "stderr": result.stderr[-600:]}
        return last_json(result.stdout)

    def smi(self, query: str, env: dict[str, str]) -> list[list[str]]:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            return [["error", out.stderr.strip()[:200] or out.stdout.strip()[:200]]]
        return [[f.strip() for f in line.split(",")] for line in out.stdout.splitlines() if line]

    def matmul_rates(self, envs: list[dict[str, str]]) -> list[float]:
        """The matmul loop's rate in each environment, all running at once."""
        processes = [gpu.start("matmul", self.seconds, env) for env in envs]
        reports = [gpu.collect(p, self.seconds) for p in processes]
        return gpu.overlap_rates(reports, self.seconds)

    def baseline(self) -> list[float]:
        """Each GPU's unlimited matmul rate (one program per GPU, at once: the GPUs are apart)."""
        if self.unlimited_matmul is None:
            envs = [self.plain | {"CUDA_VISIBLE_DEVICES": uuid} for uuid in self.uuids[:2]]
            self.unlimited_matmul = self.matmul_rates(envs)
            emit(
                {
                    "measure": "baseline",
                    "matmul_per_s": [round(r, 2) for r in self.unlimited_matmul],
                }
            )
        return self.unlimited_matmul

    def memory_check(self, limit: int, allocated: int) -> dict[str, Any]:
        """What a program could allocate under a memory limit, against limit - context charge."""
        room = limit - self.charge
        return {
            "limit": limit,
            "allocated": allocated,
            "room": room,
            "memory_ok": room - 32 * MiB <= allocated <= room,
        }


def confine(node: Node) -> None:
    """Two pods, one per GPU, each with its own limits."""
    shapes = {"gpu0": (0, 8 * GiB, 30.0), "gpu1": (1, 4 * GiB, 60.0)}
    for name, (index, memory, compute) in shapes.items():
        node.create(name, {str(index): {"memory": memory, "compute": compute}})
    envs = {}
    for name, (index, memory, _) in shapes.items():
        uuid = node.uuids[index]
        everything = node.program(node.env(name), "probe")
        own = node.program(node.env(name, visible=uuid), "probe")
        smi = node.smi("--query-gpu=uuid,memory.total", node.env(name))
        filled = node.program(node.env(name, visible=uuid), "fill", "0")
        usable = [d["ordinal"] for d in everything.get("devices", []) if d.get("usable")]
        emit(
            {
                "measure": "confine",
                "pod": name,
                "gpu": index,
                "all_visible": {
                    "device_count": everything.get("device_count"),
                    "usable": usable,
                    "total": [d.get("total") for d in everything.get("devices", [])],
                },
                "errors": [
                    d.get("error") for d in everything.get("devices", []) if not d.get("usable")
                ],
                "own_visible": {
                    "device_count": own.get("device_count"),
                    "total": [d.get("total") for d in own.get("devices", [])],
                },
                "nvidia_smi": smi,
                # Device 0 is the pod's GPU with every GPU visible too (the library sets
                # CUDA_VISIBLE_DEVICES to the pod's GPUs when the program did not).
                "sees_only_its_gpu": usable == [0]
                and [row[0] for row in smi] == [uuid]
                and own.get("device_count") == 1,
            }
            | node.memory_check(memory, filled.get("allocated", -1))
        )
        envs[name] = node.env(name, visible=uuid)
    base = node.baseline()
    rates = node.matmul_rates(list(envs.values()))
    for (name, (index, _, compute)), rate in zip(shapes.items(), rates, strict=True):
        share = round(100 * rate / base[index], 1)
        emit(
            {
                "measure": "confine_compute",
                "pod": name,
                "gpu": index,
                "limit": compute,
                "share_pct": share,
                "compute_ok": abs(share - compute) <= TOLERANCE_POINTS,
            }
        )


def pergpu(node: Node) -> None:
    """One pod on two GPUs with different limits on each."""
    limits = {0: (8 * GiB, 30.0), 1: (4 * GiB, 60.0)}
    node.create("both", {str(i): {"memory": m, "compute": c} for i, (m, c) in limits.items()})
    for index, (memory, _) in limits.items():
        filled = node.program(node.env("both"), "fill", str(index))
        emit(
            {"measure": "pergpu_memory", "gpu": index}
            | node.memory_check(memory, filled.get("allocated", -1))
        )
    base = node.baseline()
    rates = node.matmul_rates([node.env("both", visible=node.uuids[i]) for i in limits])
    for (index, (_, compute)), rate in zip(limits.items(), rates, strict=True):
        share = round(100 * rate / base[index], 1)
        emit(
            {
                "measure": "pergpu_compute",
                "gpu": index,
                "limit": compute,
                "share_pct": share,
                "compute_ok": abs(share - compute) <= TOLERANCE_POINTS,
            }
        )


class Sampler:
    """The pods' charged memory per GPU and NVML's per-GPU use by compute processes, every
    0.25 s: the highest of each."""

    def __init__(self, node: Node, pods: list[str]) -> None:
        self.node, self.pods = node, pods
        self.charged: dict[str, dict[int, int]] = {pod: {} for pod in pods}
        self.nvml: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for pod in self.pods:
                for index, used in self.node.charged(pod).items():
                    self.charged[pod][index] = max(self.charged[pod].get(index, 0), used)
            per_gpu: dict[str, int] = {}
            for row in self.node.smi("--query-compute-apps=gpu_uuid,used_memory", self.node.plain):
                if len(row) == 2 and row[1].isdigit():
                    per_gpu[row[0]] = per_gpu.get(row[0], 0) + int(row[1]) * MiB
            for uuid, used in per_gpu.items():
                self.nvml[uuid] = max(self.nvml.get(uuid, 0), used)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def torchrun(env: dict[str, str], port: int, steps: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
            *("--master-addr", "127.0.0.1", "--master-port", str(port)),
            *(str(PROGRAMS), "ddp", str(steps), str(seconds)),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def finish(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return {"timed_out": True, "stderr": err[-600:]}
    if process.returncode != 0:
        return {"failed": process.returncode, "stderr": err[-800:]}
    return last_json(out)


def rate(report: dict[str, Any]) -> float:
    return float(report["steps"]) / float(report["seconds"]) if report.get("seconds") else 0.0


def unlimited_ddp(node: Node, steps: int) -> dict[str, Any]:
    if node.unlimited_ddp is None:
        node.unlimited_ddp = finish(torchrun(node.plain, free_port(), steps, 0), 300)
    return node.unlimited_ddp


def ddp(node: Node, steps: int) -> None:
    """A DDP job unlimited, then in a pod of 8 GiB / 50 % on each GPU."""
    free = unlimited_ddp(node, steps)
    node.create("ddp", {str(i): {"memory": 8 * GiB, "compute": 50} for i in (0, 1)})
    sampler = Sampler(node, ["ddp"])
    environment = node.env("ddp") | pacing_log(node, "ddp")
    limited = finish(torchrun(environment, free_port(), steps, 0), 240)
    sampler.stop()
    ratio = rate(limited) / rate(free) if rate(free) else None
    emit(
        {
            "measure": "ddp",
            "steps": steps,
            "unlimited": {
                k: free.get(k)
                for k in ("steps", "seconds", "loss", "timed_out", "failed", "stderr")
            },
            "limited": {
                k: limited.get(k)
                for k in ("steps", "seconds", "loss", "timed_out", "failed", "stderr")
            },
            "same_loss": free.get("loss") is not None and free.get("loss") == limited.get("loss"),
            "throughput_ratio": None if ratio is None else round(ratio, 3),
            "charged_max": sampler.charged["ddp"],
            "nvml_max": [sampler.nvml.get(uuid, 0) for uuid in node.uuids[:2]],
            "torch_reserved": limited.get("torch_reserved"),
            "context_charge": node.charge,
            "pacing": pacing_summary(node, "ddp"),
        }
    )


def ddp_pair(node: Node, steps: int) -> None:
    """Two DDP jobs at once in pods of 30 % and 70 % on both GPUs."""
    alone = rate(unlimited_ddp(node, steps))
    shares = {"ddp30": 30.0, "ddp70": 70.0}
    for name, share in shares.items():
        node.create(name, {str(i): {"memory": 8 * GiB, "compute": share} for i in (0, 1)})
    seconds = node.seconds * 2
    jobs = [
        torchrun(node.env(name) | pacing_log(node, name), free_port(), 1 << 30, seconds)
        for name in shares
    ]
    reports = [finish(job, seconds + 240) for job in jobs]
    if any("marks" not in r for r in reports):
        emit({"measure": "ddp_pair", "reports": reports})
        return
    rates = gpu.overlap_rates(reports, seconds)
    got = [round(100 * r / alone, 1) for r in rates]
    emit(
        {
            "measure": "ddp_pair",
            "limits": list(shares.values()),
            "share_pct": got,
            "steps": [r["steps"] for r in reports],
            "pacing": {name: pacing_summary(node, name) for name in shares},
            "shares_ok": all(
                abs(g - s) <= TOLERANCE_POINTS for g, s in zip(got, shares.values(), strict=True)
            ),
        }
    )


def ipc(node: Node) -> None:
    """A 1 GiB allocation opened by a second process of the pod through CUDA IPC."""
    node.create("ipc", {"0": {"memory": 16 * GiB}})
    process = subprocess.Popen(
        [sys.executable, str(PROGRAMS), "ipc"],
        env=node.env("ipc", visible=node.uuids[0]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    first = process.stdout.readline()
    if not first.startswith("{"):
        process.kill()
        emit({"measure": "ipc", "failed": True, "stderr": process.communicate()[1][-600:]})
        return
    time.sleep(2)  # the daemon's pass reads the region
    used = node.charged("ipc").get(0, 0)
    process.stdin.close()
    process.wait(timeout=60)
    once = GiB + 2 * node.charge
    emit(
        {
            "measure": "ipc",
            "charged": used,
            "expected_once": once,
            "expected_twice": once + GiB,
            "charged_once": once <= used < once + 256 * MiB,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True)
    parser.add_argument(
        "--only", nargs="*", default=["confine", "pergpu", "ddp", "ddp_pair", "ipc"]
    )
    parser.add_argument("--seconds", type=int, default=10, help="each compute measurement")
    parser.add_argument("--steps", type=int, default=400, help="the DDP job's training steps")
    args = parser.parse_args()
    node = Node(str(Path(args.library).resolve()), args.seconds)
    try:
        for case in args.only:
            if case == "confine":
                confine(node)
            elif case == "pergpu":
                pergpu(node)
            elif case == "ddp":
                ddp(node, args.steps)
            elif case == "ddp_pair":
                ddp_pair(node, args.steps)
            elif case == "ipc":
                ipc(node)
            else:
                raise SystemExit(f"unknown case {case!r}")
    finally:
        node.daemon.stop()


if __name__ == "__main__":
    main()
