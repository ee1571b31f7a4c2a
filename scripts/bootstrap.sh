# Sourced by the other scripts: a private tool environment (.tools/) with uv and nox from PyPI,
# made with nothing but Python >= 3.11. Safe to source again; it only installs what is missing.
set -euo pipefail

VGPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VGPU_PYTHON=${PYTHON:-python3}
UV_VERSION=0.13.9
NOX_VERSION=2026.10.20

if ! "$VGPU_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: $VGPU_PYTHON is missing or older than Python 3.11 (set PYTHON=/path/to/python3.11+)" >&2
    exit 2
fi

tools="$VGPU_ROOT/.tools"
if ! "$tools/bin/uv" --version 2>/dev/null | grep -q " $UV_VERSION" ||
    ! "$tools/bin/nox" --version 2>&1 | grep -q "^$NOX_VERSION"; then
    "$VGPU_PYTHON" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check \
        "uv==$UV_VERSION" "nox==$NOX_VERSION"
fi
export PATH="$tools/bin:$PATH"
export UV_PYTHON="$VGPU_PYTHON"
cd "$VGPU_ROOT"
