#!/usr/bin/env bash
# The main job: the tf-hypervisor node daemon, on the NVIDIA driver or (where there is none) on
# the simulated GPU, with a short tour: a pod created through the CLI, a program running in it
# under the limiter, and what the daemon sees. The daemon then keeps running until Ctrl-C
# (RUN_TOUR_ONLY=1 stops it after the tour).
#
# Its files live under .run/ in the checkout (regions, token, metrics, log, simulated node);
# the usual variables and flags override them (tf-hypervisor config show lists them all).
started=$SECONDS
# A step of the set-up, with the seconds since the start: long steps say so before they begin.
step() { echo "== [$((SECONDS - started)) s] $*"; }
step "setting up: the toolchain and the environment (the first run builds the C libraries: a minute or two)"
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
uv sync --locked --quiet
step "environment ready"
bin="$VGPU_ROOT/.venv/bin"
run="$VGPU_ROOT/.run"
mkdir -p "$run"
export SHM_BASE_PATH="${SHM_BASE_PATH:-$run/shm}"
export TF_HYPERVISOR_TOKEN_FILE="${TF_HYPERVISOR_TOKEN_FILE:-$run/hypervisor.token}"
export GPU_METRICS_FILE="${GPU_METRICS_FILE:-$run/metrics.influx}"
export VGPU_SIM_STATE="${VGPU_SIM_STATE:-$run/sim-node.state}"
export VGPU_SIM_DEVICES="${VGPU_SIM_DEVICES:-2}"
tfh="$bin/tf-hypervisor"
log="$run/daemon.log"
ports="$bin/python $VGPU_ROOT/scripts/tcp_port.py"

# The address: API_LISTEN_ADDR if given (and free), else the daemon's default 127.0.0.1:8080 (so
# `tf-hypervisor` in another shell finds it with no variables) or, when something else holds
# that, a free port the kernel picks. Either way the tour says who holds a busy port.
if [ -n "${API_LISTEN_ADDR:-}" ]; then
    $ports check "$API_LISTEN_ADDR" || exit 1
elif ! holder=$($ports check 127.0.0.1:8080 2>&1); then
    export API_LISTEN_ADDR="127.0.0.1:$($ports free)"
    step "${holder#error: }; this daemon listens on $API_LISTEN_ADDR instead"
else
    export API_LISTEN_ADDR=127.0.0.1:8080
fi

step "starting tf-hypervisor daemon on $API_LISTEN_ADDR (log: $log)"
"$tfh" daemon --log-path "$log" "$@" &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null' EXIT
# Ready when it answers and the answer is ours: the listener is the process started here and
# its regions are under our base path (not another checkout's daemon on the same address).
ready=0
for _ in $(seq 150); do
    kill -0 "$daemon" 2>/dev/null || { cat "$log"; exit 1; }
    if answer=$("$tfh" status --json 2>/dev/null); then
        if ! $ports owner "$API_LISTEN_ADDR" "$daemon" ||
            [[ "$answer" != *"\"shm_base_path\": \"$SHM_BASE_PATH\""* ]]; then
            echo "error: another daemon answers on $API_LISTEN_ADDR, not the one started here" >&2
            exit 1
        fi
        ready=1
        break
    fi
    sleep 0.2
done
[ "$ready" = 1 ] || { echo "error: the daemon did not answer on $API_LISTEN_ADDR in 30 s (log: $log)" >&2; exit 1; }
step "daemon ready"
"$tfh" status

step "a pod: 4 GiB and 30 % of GPU 0"
"$tfh" pods delete demo --force >/dev/null 2>&1 || true
"$tfh" pods create demo --mem 0=4GiB --compute 0=30

# Read whole, then matched: `grep -q` may close the pipe before the CLI is done writing.
if [[ "$("$tfh" status --json)" == *'"backend": "simulated"'* ]]; then
    step "a program in the pod: 1 GiB and 2 ms kernels on the simulated GPU, paced to 30 %"
    "$bin/tf-limiter" sim run --state "$VGPU_SIM_STATE" -- \
        "$bin/tf-limiter" run --pod demo -- \
        "$("$bin/python" -c 'from vgpu_limiter import sim; print(sim.workload_path())')" \
        --alloc 1GiB --kernels 3000 --kernel-us 2000 >/dev/null &
    worker=$!
    # Shown once the daemon sees it holding its memory (up to 30 s on a busy machine).
    for _ in $(seq 150); do
        "$tfh" pods get demo --json 2>/dev/null | "$bin/python" -c 'import json, sys
sys.exit(json.load(sys.stdin)["gpus"][0]["memory_used"] < 1 << 30)' && break
        sleep 0.2
    done
    "$tfh" workers
    "$tfh" pods list
    echo "   (used is the 1 GiB the program holds plus its CUDA context: each process of a pod"
    echo "   is charged the daemon's --context-charge, 544 MiB by default, as a real context takes)"
    step "/metrics (the pod's series; reads need the token too)"
    "$bin/python" -c 'import sys, urllib.request
token = open(sys.argv[2]).read().strip()
request = urllib.request.Request(sys.argv[1], headers={"Authorization": f"Bearer {token}"})
print(urllib.request.urlopen(request).read().decode(), end="")' \
        "http://$API_LISTEN_ADDR/metrics" "$TF_HYPERVISOR_TOKEN_FILE" | grep '^tf_pod_' || true
    kill "$worker" 2>/dev/null || true
    wait "$worker" 2>/dev/null || true
else
    echo "== run a CUDA program in the pod with: SHM_BASE_PATH=$SHM_BASE_PATH $bin/tf-limiter run --pod demo -- PROGRAM"
fi

if [ "${RUN_TOUR_ONLY:-0}" = 1 ]; then
    exit 0
fi
step "the daemon runs until Ctrl-C; in another shell (same variables): $tfh top"
echo "   export SHM_BASE_PATH=$SHM_BASE_PATH API_LISTEN_ADDR=$API_LISTEN_ADDR TF_HYPERVISOR_TOKEN_FILE=$TF_HYPERVISOR_TOKEN_FILE"
wait "$daemon"
