#!/usr/bin/env bash
# The main job. Until the node daemon lands this shows the pieces that exist: the add-path
# preload library, and a program on the simulated GPU seen from NVML by another process.
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
uv sync --locked --quiet
bin="$VGPU_ROOT/.venv/bin"

echo "== libadd_path.so: $("$bin/tf-add-path" path)"
echo "-- a shell started with TF_PREPEND_PATH=/opt/a TF_PATH=/opt/b (LD_BIND_NOW=1):"
LD_BIND_NOW=1 LD_PRELOAD=$("$bin/tf-add-path" path) TF_PREPEND_PATH=/opt/a TF_PATH=/opt/b \
    sh -c 'echo "PATH=$PATH"'
echo "-- tf-add-path exec --prepend PATH=/opt/vgpu/bin --append LD_LIBRARY_PATH=/opt/vgpu/lib:"
"$bin/tf-add-path" exec --prepend PATH=/opt/vgpu/bin --append LD_LIBRARY_PATH=/opt/vgpu/lib -- \
    sh -c 'echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"'

echo "== the simulated GPU (a node of two 80 GiB devices in a fresh state file)"
state=$(mktemp -d)/node.state
sim=("$bin/tf-limiter" sim)
echo "-- a workload: 3 GiB, 100 kernels of 10 ms through cuGetProcAddress_v2:"
"${sim[@]}" workload --state "$state" --path procaddress --alloc 3GiB --kernels 100 --kernel-us 10000
echo "-- NVML from another process while a workload holds 6 GiB on device 1:"
"${sim[@]}" workload --state "$state" --device 1 --alloc 6GiB --kernels 50 --kernel-us 20000 \
    --hold 5 >/dev/null &
holder=$!
sleep 1.5
"${sim[@]}" run --state "$state" -- "$bin/python" - <<'PY'
import pynvml

pynvml.nvmlInit()
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    busy = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    print(f"GPU {index} {pynvml.nvmlDeviceGetName(handle)} {pynvml.nvmlDeviceGetUUID(handle)}: "
          f"{memory.used >> 20} / {memory.total >> 20} MiB used, {busy} % busy")
    for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        print(f"    pid {process.pid}: {process.usedGpuMemory >> 20} MiB")
PY
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
rm -rf "$(dirname "$state")"
