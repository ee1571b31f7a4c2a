"""The limiter is a guest in other people's processes: what it exports must behave for every
other library of the process as the real one does."""

import os
import subprocess
from pathlib import Path

from tests.limiter.conftest import C_TESTS, LimitedEnv


def test_a_library_chaining_with_rtld_next_gets_the_next_definition_not_itself(
    limited_env: LimitedEnv, tmp_path: Path
) -> None:
    """The limiter's dlsym is the program's. glibc takes RTLD_NEXT to mean after the object
    that called dlsym, which was the limiter: a library that wrapped getppid() and chained to
    the next one got its own wrapper back and recursed until the stack ran out."""
    library, program = tmp_path / "librtldnext.so", tmp_path / "rtld_next_main"
    flags = ("cc", "-std=c11", "-Wall", "-Wextra", "-Werror")
    subprocess.run(
        [*flags, "-shared", "-fPIC", str(C_TESTS / "rtld_next_wrapper.c"), "-o", str(library)],
        check=True,
    )
    main = str(C_TESTS / "rtld_next_main.c")
    rpath = f"-Wl,-rpath,{tmp_path}"
    subprocess.run([*flags, main, str(library), "-o", str(program), rpath], check=True)
    for environment in (limited_env(preload=False), limited_env()):
        result = subprocess.run(
            [str(program)], env=environment, capture_output=True, text=True, check=False
        )
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        assert result.stdout == f"{os.getpid()}\n"
