"""Run a script through a real launcher with an exact environment and read variables back."""

import shutil
import subprocess
from collections.abc import Mapping

TARGETS = ("PATH", "LD_PRELOAD", "LD_LIBRARY_PATH")

# Each launcher gets exactly the given environment: sh and bash through subprocess, and
# `env -i VAR=… /bin/sh`, which builds it on its own command line from an empty one.
LAUNCHERS = ("sh", "bash", "env -i")

# Prints each variable as NAME=value, or NAME!unset, as the shell saw it at startup (after
# the preloaded constructor ran).
_REPORT = """
for name in PATH LD_PRELOAD LD_LIBRARY_PATH; do
  eval "is_set=\\${$name+x}"
  if [ "$is_set" = x ]; then
    eval "printf '%s=%s\\n' $name \\"\\$$name\\""
  else
    echo "$name!unset"
  fi
done
"""


def launch(
    launcher: str, environment: Mapping[str, str], script: str
) -> subprocess.CompletedProcess[str]:
    if launcher == "env -i":
        command = [
            shutil.which("env") or "/usr/bin/env",
            "-i",
            *(f"{k}={v}" for k, v in environment.items()),
            "/bin/sh",
            "-c",
            script,
        ]
        return subprocess.run(
            command, env={}, capture_output=True, text=True, timeout=30, check=False
        )
    shell = shutil.which(launcher) or f"/bin/{launcher}"
    return subprocess.run(
        [shell, "-c", script],
        env=dict(environment),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def report(launcher: str, environment: Mapping[str, str]) -> dict[str, str | None]:
    """The three target variables as the launched shell sees them (None: unset)."""
    result = launch(launcher, environment, _REPORT)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    values: dict[str, str | None] = {}
    for line in result.stdout.splitlines():
        if line.endswith("!unset"):
            values[line.removesuffix("!unset")] = None
        else:
            name, _, value = line.partition("=")
            values[name] = value
    assert set(values) == set(TARGETS)
    return values
