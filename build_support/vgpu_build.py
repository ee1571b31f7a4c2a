"""Build machinery shared by the vgpu packages (one source, linked into each package).

Two jobs:

* Native libraries: the preload libraries are plain shared objects loaded into processes
  that are not Python (bash, nvidia-smi, any CUDA binary). They must not link libpython, carry
  an RPATH or depend on anything but libc, so they are built with one direct compiler call with
  flags we own, instead of distutils' extension machinery (which injects Python's own flags).
* Sibling requirements: the packages depend on each other but are not on PyPI. From a source
  checkout a dependency on a sibling becomes a direct reference to its folder, so
  ``pip install ./packages/X`` works alone; elsewhere (an unpacked sdist) it is pinned by name
  to the same version.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

# Warnings are errors; hidden visibility so only symbols marked for export leave the library.
# -flto: each library is compiled and linked in one call, so link-time optimization sees all of
# it and inlines across files (the launch path crosses five of them). On an H100 a paced launch
# added a median 186 ns with it against 208 without (four runs each, alternating), an unpaced
# one 33 against 38. One partition: the old glibc versions the limiter binds its imports to are
# top-level `.symver` statements (glibc_compat.h), which hold only for code in their partition
# (with several, pthread_once slipped to GLIBC_2.34).
BASE_CFLAGS = [
    "-std=c11",
    "-O2",
    "-flto=auto",
    "-flto-partition=one",
    "-g",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
]
# --no-undefined: every symbol must resolve against the listed libraries (catches a stray
# libpython reference at build time); --as-needed keeps NEEDED down to what is really used.
BASE_LDFLAGS = [
    "-shared",
    "-Wl,--no-undefined",
    "-Wl,--as-needed",
    "-Wl,-z,noexecstack",
    "-Wl,-z,relro",
]


class NativeLibrary(Extension):
    """A plain shared object, e.g. ``NativeLibrary("vgpu_add_path.libadd_path", ["csrc/x.c"])``
    is installed as ``vgpu_add_path/libadd_path.so``.

    ``filename`` overrides the file name (``libcuda.so.1``); ``executable`` links a program
    instead; ``preprocess`` only runs the C preprocessor over the one source (keeping its
    #defines), e.g. to hand a C header to cffi; ``link_native`` names earlier NativeLibrary
    objects the result links against.
    """

    def __init__(
        self,
        name: str,
        sources: list[str],
        *,
        filename: str | None = None,
        executable: bool = False,
        preprocess: bool = False,
        link_native: tuple[str, ...] = (),
        **options: Any,
    ) -> None:
        super().__init__(name, sources, **options)
        self.filename = filename
        self.executable = executable
        self.preprocess = preprocess
        self.link_native = link_native


class BuildNative(build_ext):
    """build_ext that builds :class:`NativeLibrary` objects with one direct compiler call."""

    def _native(self, name: str) -> NativeLibrary | None:
        # Called with the dotted name and with its last part alone.
        for ext in self.extensions:
            if isinstance(ext, NativeLibrary) and name in {ext.name, ext.name.rpartition(".")[2]}:
                return ext
        return None

    def get_ext_filename(self, fullname: str) -> str:
        native = self._native(fullname)
        if native is not None:
            parts = fullname.split(".")
            default = parts[-1] + ("" if native.executable or native.preprocess else ".so")
            return str(Path(*parts[:-1], native.filename or default))
        return str(super().get_ext_filename(fullname))  # type: ignore[no-untyped-call]

    def copy_extensions_to_source(self) -> None:
        # Editable installs copy each output next to its sources; its folder may not exist yet.
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            package = self.get_ext_fullname(ext.name).rpartition(".")[0]
            Path(build_py.get_package_dir(package)).mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
        super().copy_extensions_to_source()

    @staticmethod
    def _defines(ext: Extension) -> list[str]:
        return [f"-D{name}={value}" if value else f"-D{name}" for name, value in ext.define_macros]

    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, NativeLibrary):
            super().build_extension(ext)
            return
        output = Path(self.get_ext_fullpath(ext.name))
        output.parent.mkdir(parents=True, exist_ok=True)
        compiler = shlex.split(os.environ.get("CC", "cc"))
        linked = []
        for name in ext.link_native:
            dependency = Path(self.get_ext_fullpath(name))
            linked += [f"-L{dependency.parent}", f"-l:{dependency.name}"]
        ldflags = [flag for flag in BASE_LDFLAGS if not (ext.executable and flag == "-shared")]
        if ext.preprocess:
            command = [*compiler, "-E", "-P", "-dD", *self._defines(ext), *ext.sources]
            print(" ".join(shlex.quote(str(part)) for part in command), file=sys.stderr)
            output.write_text(
                subprocess.run(command, check=True, capture_output=True, text=True).stdout
            )
            return
        command = [
            *compiler,
            *BASE_CFLAGS,
            *(f"-I{folder}" for folder in ext.include_dirs),
            *self._defines(ext),
            *ext.extra_compile_args,
            *ext.sources,
            "-o",
            str(output),
            *ldflags,
            *ext.extra_link_args,
            *linked,
            *(f"-l{library}" for library in ext.libraries),
        ]
        print(" ".join(shlex.quote(str(part)) for part in command), file=sys.stderr)
        subprocess.run(command, check=True)


class PlatformWheel(bdist_wheel):
    """The native libraries do not use the Python ABI: tag wheels py3-none-<platform>."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


def _own_version(package_dir: Path) -> str:
    with (package_dir / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def sibling_requirement(package_dir: Path, distribution: str) -> str:
    """``vgpu-common`` → a direct reference to ../common in a checkout, else ``vgpu-common==V``.

    An sdist is made to be built elsewhere, so its metadata always carries the pinned form.
    """
    folder = package_dir.parent / distribution.removeprefix("vgpu-").replace("-", "_")
    if (folder / "pyproject.toml").is_file() and "sdist" not in sys.argv[1:]:
        return f"{distribution} @ {folder.resolve().as_uri()}"
    return f"{distribution}=={_own_version(package_dir)}"


def setup_package(
    setup_file: str,
    *,
    requires: list[str],
    extras: dict[str, list[str]] = {},  # noqa: B006 - read only
    siblings: list[str] = [],  # noqa: B006 - read only
    native: list[NativeLibrary] = [],  # noqa: B006 - read only
) -> None:
    """Run setuptools for one vgpu package; the rest of the metadata is in its pyproject.toml."""
    package_dir = Path(setup_file).resolve().parent
    extra: dict[str, Any] = {}
    if native:
        extra = {
            "ext_modules": native,
            "cmdclass": {"build_ext": BuildNative, "bdist_wheel": PlatformWheel},
        }
    setup(
        install_requires=[
            *requires,
            *(sibling_requirement(package_dir, name) for name in siblings),
        ],
        extras_require=extras,
        **extra,
    )
