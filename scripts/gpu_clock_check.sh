#!/usr/bin/env bash
# On a GPU machine: SM clock and power while a bf16 matmul loop runs unlimited and at a 50 %
# compute limit (results under $OUT). Used to tell apart time metering and clock effects.
set -u
library=${1:?usage: gpu_clock_check.sh path/to/libcuda_limiter.so}
python3 -c "import importlib.util as u; s = u.spec_from_file_location('b', 'benchmarks/limiter_compute_gpu.py'); m = u.module_from_spec(s); s.loader.exec_module(m); open('/tmp/vgpu_program.py', 'w').write(m.PROGRAM)"
for mode in none 50; do
    nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 >"$OUT/clock_$mode.csv" &
    smi=$!
    if [ "$mode" = none ]; then
        python3 /tmp/vgpu_program.py matmul 8 >"$OUT/matmul_$mode.json"
    else
        env LD_PRELOAD="$PWD/$library" SHM_PATH=/tmp/vgpu-clock SHM_BASE_PATH=/tmp/vgpu-clock-base \
            TENSOR_FUSION_CUDA_UP_LIMIT='{"0":50}' python3 /tmp/vgpu_program.py matmul 8 >"$OUT/matmul_$mode.json"
    fi
    kill "$smi"
    python3 - "$mode" <<'PY'
import json, os, statistics, sys
mode = sys.argv[1]
rows = [line.split(",") for line in open(f"{os.environ['OUT']}/clock_{mode}.csv") if line.strip()]
rows = rows[5:-2]
marks = json.load(open(f"{os.environ['OUT']}/matmul_{mode}.json"))["marks"]
print(json.dumps({"measure": "clocks", "limit": mode,
                  "sm_clock_mhz_median": statistics.median(float(r[0]) for r in rows),
                  "power_w_median": statistics.median(float(r[1]) for r in rows),
                  "power_w_max": max(float(r[1]) for r in rows),
                  "matmuls_per_s": round(marks[-1][1] / marks[-1][0], 1)}))
PY
done
