"""Programs that benchmarks/multigpu_gpu.py runs under the limiter, each printing one JSON line.

probe             what the program sees: torch.cuda.device_count() and, for each device, its
                  name, whether 64 MiB can be allocated on it (a context made) and the view
                  (free, total) it gets
fill DEVICE       allocate 256 MiB, then 16 MiB blocks on one device until it is refused:
                  the bytes the program got
ddp STEPS SECONDS one rank of a data-parallel (DDP, NCCL) training job, run by torchrun:
                  a 6-layer 4096-wide MLP, fixed seeds, SGD; stops after STEPS steps or
                  SECONDS (0: none), whichever comes first; rank 0 prints the job's report
ipc               one process allocates 1 GiB, a second (spawned) opens it through a CUDA IPC
                  handle; both hold it until stdin closes
"""

import json
import os
import sys
import time
from typing import Any


def probe() -> dict[str, Any]:
    import torch

    count = torch.cuda.device_count()
    devices: list[dict[str, Any]] = []
    for ordinal in range(count):
        entry: dict[str, Any] = {"ordinal": ordinal}
        try:
            entry["name"] = torch.cuda.get_device_name(ordinal)
            block = torch.empty(64 << 20, dtype=torch.uint8, device=f"cuda:{ordinal}")
            torch.cuda.synchronize(ordinal)
            free, total = torch.cuda.mem_get_info(ordinal)
            entry |= {"usable": True, "free": free, "total": total}
            del block
        except Exception as error:  # the limiter refuses a context on a GPU not the pod's
            entry |= {"usable": False, "error": str(error).strip().splitlines()[0][:200]}
        devices.append(entry)
    return {"device_count": count, "devices": devices}


def fill(device: int) -> dict[str, Any]:
    import torch

    blocks = []
    got = 0
    for size in (256 << 20, 16 << 20):
        while True:
            try:
                blocks.append(torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}"))
            except torch.OutOfMemoryError:
                break
            got += size
    free, total = torch.cuda.mem_get_info(device)
    return {"device": device, "allocated": got, "free": free, "total": total}


def ddp(steps: int, seconds: float) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    model = DistributedDataParallel(
        torch.nn.Sequential(*layers, torch.nn.Linear(4096, 1)).to(device), device_ids=[local]
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = torch.Generator(device=device).manual_seed(1000 + rank)

    def step() -> torch.Tensor:
        x = torch.randn(512, 4096, device=device, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x.mean(dim=1, keepdim=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    for _ in range(3):  # NCCL's and cuBLAS's set-up outside the counted steps
        step()
    torch.cuda.synchronize()
    stop = torch.zeros(1, device=device)
    marks: list[tuple[float, int]] = []
    losses: list[float] = []
    begin, started = time.perf_counter(), time.time()
    done = 0
    while done < steps:
        loss = step()
        done += 1
        if done % 10 == 0:
            mean = loss.clone()
            dist.all_reduce(mean)
            losses.append(round(mean.item() / dist.get_world_size(), 6))
            marks.append((time.perf_counter() - begin, done))
            # Every rank stops at the same step: rank 0's clock decides.
            stop.fill_(1 if rank == 0 and seconds and marks[-1][0] >= seconds else 0)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break
    reserved = torch.tensor([float(torch.cuda.max_memory_reserved(device))], device=device)
    gathered = [torch.zeros_like(reserved) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, reserved)
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {
        "steps": done,
        "seconds": round(marks[-1][0], 3) if marks else 0.0,
        "marks": marks,
        "started": started,
        "loss": losses[-1] if losses else None,
        "losses": losses[:: max(1, len(losses) // 20)],
        "torch_reserved": [int(t.item()) for t in gathered],
    }


def _open_and_hold(queue: Any, ready: Any) -> None:
    block = queue.get()  # a CUDA tensor: torch opens the sender's IPC handle
    ready.put(int(block.numel()))
    queue.get()  # hold until told to end


def ipc() -> dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue, ready = context.Queue(), context.Queue()
    block = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    child = context.Process(target=_open_and_hold, args=(queue, ready))
    child.start()
    queue.put(block)
    opened = ready.get(timeout=120)
    print(json.dumps({"holding": True, "bytes": opened, "pids": [os.getpid(), child.pid]}))
    sys.stdout.flush()
    sys.stdin.read()  # the benchmark reads the pod's charge meanwhile, then closes stdin
    queue.put(None)
    child.join(timeout=60)
    return {"holding": False, "child_exit": child.exitcode}


def main() -> None:
    kind = sys.argv[1]
    if kind == "probe":
        report: dict[str, Any] | None = probe()
    elif kind == "fill":
        report = fill(int(sys.argv[2]))
    elif kind == "ddp":
        report = ddp(int(sys.argv[2]), float(sys.argv[3]))
    elif kind == "ipc":
        report = ipc()
    else:
        raise SystemExit(f"unknown program {kind!r}")
    if report is not None:
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
