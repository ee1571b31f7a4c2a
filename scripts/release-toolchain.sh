#!/usr/bin/env bash
# Debian's arm64 cross toolchain and qemu-user, which `nox -s release` needs; installed with
# apt-get when missing (CI runs as root), otherwise the command to run is printed.
set -euo pipefail
declare -A wanted=(
    [gcc-aarch64-linux-gnu]=/usr/bin/aarch64-linux-gnu-gcc
    [libc6-dev-arm64-cross]=/usr/aarch64-linux-gnu/lib/libc.so
    [qemu-user]=/usr/bin/qemu-aarch64
)
missing=()
for package in "${!wanted[@]}"; do
    [[ -e ${wanted[$package]} ]] || missing+=("$package")
done
((${#missing[@]} == 0)) && exit 0
if ((EUID != 0)); then
    echo "error: missing ${missing[*]}: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
