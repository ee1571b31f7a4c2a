#!/usr/bin/env bash
# The daemon on a real GPU, from a source tree with the limiter built:
#  - it discovers the GPU through NVML;
#  - a PyTorch program run in a pod created by the CLI shows up in `workers` and /metrics;
#  - `pods update` lowers the pod's memory limit and the program's next allocation over it fails.
# Output goes to stdout and to $OUT (default: a new temporary folder).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
ROOT=$(mktemp -d)
PORT=${PORT:-18080}
export PYTHONPATH="$PWD/packages/common/src:$PWD/packages/limiter/src:$PWD/packages/hypervisor/src${PYTHONPATH:+:$PYTHONPATH}"
FLAGS=(--listen "127.0.0.1:$PORT" --token-file "$ROOT/token")
tfh() { python3 -m vgpu_hypervisor "$@" "${FLAGS[@]}"; }
step() { printf '\n### %s\n' "$*"; }

python3 -m vgpu_hypervisor daemon --config '' --shm-base-path "$ROOT/shm" \
    --metrics-file "$ROOT/metrics.influx" --log-path "$ROOT/daemon.log" "${FLAGS[@]}" &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; cp "$ROOT"/daemon.log "$ROOT"/metrics.influx "$OUT"/ 2>/dev/null' EXIT
for _ in $(seq 100); do
    curl -sf "127.0.0.1:$PORT/healthz" >/dev/null && break
    sleep 0.1
done

step "daemon log (first line: the GPU backend)"
head -3 "$ROOT/daemon.log"
step "tf-hypervisor status / gpus"
tfh status
tfh gpus

step "tf-hypervisor pods create torch --mem 0=8GiB"
tfh pods create torch --mem 0=8GiB

cat >"$ROOT/workload.py" <<'EOF'
import json, os, sys, time
import torch

def step(name, size_gib):
    try:
        tensor = torch.empty(int(size_gib * (1 << 30)), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        return {"step": name, "gib": size_gib, "ok": True}, tensor
    except torch.OutOfMemoryError as error:
        return {"step": name, "gib": size_gib, "ok": False, "error": str(error).splitlines()[0]}, None

report = {"pid": os.getpid(), "total_mib": torch.cuda.mem_get_info()[1] >> 20}
first, keep = step("before update", 4)
report["steps"] = [first]
open(sys.argv[1], "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
report["total_mib_after_update"] = torch.cuda.mem_get_info()[1] >> 20
for name, size in (("over the new limit", 2), ("under the new limit", 1)):
    result, tensor = step(name, size)
    report["steps"].append(result)
    del tensor
    torch.cuda.empty_cache()
print(json.dumps(report))
EOF

step "a PyTorch program in the pod (tf-limiter run --pod torch)"
SHM_BASE_PATH="$ROOT/shm" python3 -m vgpu_limiter run --pod torch -- \
    python3 "$ROOT/workload.py" "$ROOT/ready" "$ROOT/go" >"$ROOT/workload.json" 2>"$ROOT/workload.err" &
WORKLOAD=$!
for _ in $(seq 600); do [ -e "$ROOT/ready" ] && break; sleep 0.1; done
sleep 1.5  # one daemon pass

step "tf-hypervisor workers / pods list"
tfh workers
tfh workers --json >"$OUT/workers.json"
tfh pods list
step "/metrics (pod and worker series)"
curl -s -H "Authorization: Bearer $(cat "$ROOT/token")" "127.0.0.1:$PORT/metrics" | grep -E '^tf_(pod|worker)_memory' | tee "$OUT/metrics.txt"
step "nvidia-smi"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv

step "tf-hypervisor pods update torch --mem 0=6GiB"
tfh pods update torch --mem 0=6GiB
touch "$ROOT/go"
wait $WORKLOAD
step "the program's report"
cat "$ROOT/workload.json" "$ROOT/workload.err" | tee "$OUT/workload.json"
sleep 1.5
step "after the program exited"
tfh pods list
tfh workers
