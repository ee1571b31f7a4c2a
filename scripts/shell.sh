#!/usr/bin/env bash
# The project's commands on PATH (tf-hypervisor, tf-limiter, tf-add-path, and the environment's
# python for benchmarks/): the checkout's .venv, made first if missing.
#
#   source scripts/shell.sh           this shell
#   bash scripts/shell.sh             a new interactive shell ($SHELL); exit returns
#   bash scripts/shell.sh CMD [ARG]…  one command
vgpu_shell_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# An active environment that has the commands (a nox session's, say) is kept.
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/tf-hypervisor" ]; then
    :
elif [ ! -x "$vgpu_shell_root/.venv/bin/tf-hypervisor" ]; then
    # In a subshell: bootstrap.sh sets shell options that must not leak into a sourcing shell.
    (source "$vgpu_shell_root/scripts/bootstrap.sh" && uv sync --locked --quiet) || {
        echo "error: could not make $vgpu_shell_root/.venv (see above)" >&2
        return 1 2>/dev/null || exit 1
    }
    export VIRTUAL_ENV="$vgpu_shell_root/.venv"
else
    export VIRTUAL_ENV="$vgpu_shell_root/.venv"
fi
case ":$PATH:" in
*":$VIRTUAL_ENV/bin:"*) ;;
*) export PATH="$VIRTUAL_ENV/bin:$PATH" ;;
esac
unset vgpu_shell_root
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run, not sourced
    if [ $# -gt 0 ]; then
        exec "$@"
    fi
    echo "vgpu commands on PATH ($VIRTUAL_ENV/bin); exit to leave" >&2
    exec "${SHELL:-bash}" -i
fi
