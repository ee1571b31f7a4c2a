"""libadd_path.so preloaded into real shells rewrites PATH, LD_PRELOAD and LD_LIBRARY_PATH."""

import shutil
import sys
from pathlib import Path

import pytest

from tests.add_path.shells import LAUNCHERS, TARGETS, launch, report

pytestmark = pytest.mark.parametrize("launcher", LAUNCHERS)


@pytest.fixture
def preloadables(tmp_path: Path, libadd_path: Path) -> list[str]:
    """Loadable libraries to use as LD_PRELOAD entries (copies of libadd_path.so)."""
    copies = []
    for name in ("liba.so", "libb.so", "libc-extra.so"):
        copy = tmp_path / name
        shutil.copy(libadd_path, copy)
        copies.append(str(copy))
    return copies


def existing_and_new(variable: str, lib: Path, extra: list[str]) -> tuple[str, list[str]]:
    """A current value for the variable and two new entries to add to it."""
    if variable == "PATH":
        return "/usr/bin:/bin", ["/opt/one", "/opt/two"]
    if variable == "LD_PRELOAD":
        return str(lib), extra[:2]
    return "/srv/lib1:/srv/lib2", ["/opt/lib/one", "/opt/lib/two"]


def base_env(lib: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(lib)}


@pytest.mark.parametrize("variable", TARGETS)
@pytest.mark.parametrize("mode", ["append", "prepend"])
def test_each_variable_append_and_prepend(
    launcher: str, variable: str, mode: str, libadd_path: Path, preloadables: list[str]
) -> None:
    current, new = existing_and_new(variable, libadd_path, preloadables)
    environment = base_env(libadd_path) | {variable: current}
    control = "TF_" if mode == "append" else "TF_PREPEND_"
    environment[control + variable] = ":".join(new)

    seen = report(launcher, environment)[variable]

    expected = [current, *new] if mode == "append" else [*new, current]
    assert seen == ":".join(expected)


@pytest.mark.parametrize("variable", TARGETS)
def test_append_and_prepend_at_once(
    launcher: str, variable: str, libadd_path: Path, preloadables: list[str]
) -> None:
    current, (first, last) = existing_and_new(variable, libadd_path, preloadables)
    environment = base_env(libadd_path) | {
        variable: current,
        f"TF_PREPEND_{variable}": first,
        f"TF_{variable}": last,
    }
    assert report(launcher, environment)[variable] == f"{first}:{current}:{last}"


def test_issue_example_under_bind_now(launcher: str, libadd_path: Path) -> None:
    environment = base_env(libadd_path) | {
        "LD_BIND_NOW": "1",
        "TF_PREPEND_PATH": "/opt/a",
        "TF_PATH": "/opt/b",
    }
    path = report(launcher, environment)["PATH"]
    assert path == "/opt/a:/usr/bin:/bin:/opt/b"


def test_multi_entry_values_skip_duplicates_and_empty_entries(
    launcher: str, libadd_path: Path
) -> None:
    environment = base_env(libadd_path) | {
        "TF_PATH": "/opt/b:/usr/bin::/opt/b:/opt/c:",
        "TF_PREPEND_PATH": ":/opt/a:/bin:/opt/a:/opt/c",
    }
    # /opt/c is prepended, so the append side does not add it again.
    assert report(launcher, environment)["PATH"] == "/opt/a:/opt/c:/usr/bin:/bin:/opt/b"


def test_existing_value_is_kept_verbatim(launcher: str, libadd_path: Path) -> None:
    environment = base_env(libadd_path) | {"PATH": "/usr/bin::/bin:/usr/bin", "TF_PATH": "/opt/x"}
    assert report(launcher, environment)["PATH"] == "/usr/bin::/bin:/usr/bin:/opt/x"


def test_empty_values_change_nothing(launcher: str, libadd_path: Path) -> None:
    environment = base_env(libadd_path) | {
        "TF_PATH": "",
        "TF_PREPEND_PATH": ":::",
        "TF_LD_LIBRARY_PATH": "",
        "TF_PREPEND_LD_PRELOAD": " : ",
    }
    seen = report(launcher, environment)
    assert seen == {
        "PATH": "/usr/bin:/bin",
        "LD_PRELOAD": str(libadd_path),
        "LD_LIBRARY_PATH": None,
    }


def test_unset_targets_are_created(launcher: str, libadd_path: Path) -> None:
    environment = {
        "LD_PRELOAD": str(libadd_path),
        "TF_PREPEND_PATH": "/usr/bin:/bin",
        "TF_LD_LIBRARY_PATH": "/opt/lib:/opt/lib64",
    }
    seen = report(launcher, environment)
    assert seen["PATH"] == "/usr/bin:/bin"
    assert seen["LD_LIBRARY_PATH"] == "/opt/lib:/opt/lib64"


def test_ld_preload_accepts_spaces_like_ld_so(
    launcher: str, libadd_path: Path, preloadables: list[str]
) -> None:
    liba, libb, libc = preloadables
    environment = base_env(libadd_path) | {
        "LD_PRELOAD": f"{libadd_path} {liba}",
        "TF_LD_PRELOAD": f"{liba} {libb}",
        "TF_PREPEND_LD_PRELOAD": f"  {libc} {libadd_path}",
    }
    assert report(launcher, environment)["LD_PRELOAD"] == f"{libc}:{libadd_path} {liba}:{libb}"


def test_children_load_the_rewritten_preload(
    launcher: str, libadd_path: Path, preloadables: list[str]
) -> None:
    liba = preloadables[0]
    environment = base_env(libadd_path) | {"TF_LD_PRELOAD": liba}
    # The shell itself was started before the rewrite; the `cat` child maps the new entry.
    result = launch(launcher, environment, "cat /proc/self/maps")
    assert result.returncode == 0, result.stderr
    assert liba in result.stdout


def test_getenv_in_a_child_program_sees_new_values(launcher: str, libadd_path: Path) -> None:
    environment = base_env(libadd_path) | {"TF_LD_LIBRARY_PATH": "/opt/lib", "TF_PATH": "/opt/b"}
    probe = "import os; print(os.environ['LD_LIBRARY_PATH'], os.environ['PATH'])"
    result = launch(launcher, environment, f"'{sys.executable}' -c \"{probe}\"")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["/opt/lib", "/usr/bin:/bin:/opt/b"]


def test_without_tf_variables_the_environment_is_untouched(
    launcher: str, libadd_path: Path
) -> None:
    environment = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C", "A_B": "x:y"}
    plain = launch(launcher, environment, "env | sort")
    preloaded = launch(launcher, environment | {"LD_PRELOAD": str(libadd_path)}, "env | sort")
    assert preloaded.returncode == plain.returncode == 0
    without_preload = [
        line for line in preloaded.stdout.splitlines() if not line.startswith("LD_PRELOAD=")
    ]
    assert without_preload == plain.stdout.splitlines()
    assert preloaded.stderr == plain.stderr == ""


def test_repeated_loading_is_idempotent(launcher: str, libadd_path: Path) -> None:
    environment = base_env(libadd_path) | {"TF_PREPEND_PATH": "/opt/a", "TF_PATH": "/opt/b"}
    # Every nested shell loads the library again; the entries are added once.
    result = launch(launcher, environment, "sh -c 'sh -c \"echo \\$PATH\"'")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "/opt/a:/usr/bin:/bin:/opt/b"


def test_other_variables_are_never_touched(launcher: str, libadd_path: Path) -> None:
    environment = base_env(libadd_path) | {"TF_PYTHONPATH": "/opt/py", "TF_PREPEND_HOME": "/x"}
    result = launch(launcher, environment, 'echo "${PYTHONPATH-unset} ${HOME-unset}"')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "unset unset"
