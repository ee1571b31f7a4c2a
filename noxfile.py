"""Developer and CI sessions. `nox` alone runs tests, lint and typecheck (what CI runs)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent / "packages" / "limiter"))
from sim_sources import driver_sources

sys.path.insert(0, str(Path(__file__).resolve().parent / "build_support"))
from release_artefacts import unpack_wheel, write_sums, write_tarball

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
# Folder under packages/ → (distribution, the sibling folders it needs, command that proves it runs)
PACKAGES: dict[str, tuple[str, tuple[str, ...], list[str]]] = {
    "common": ("vgpu-common", (), ["python", "-c", "import vgpu_common.cli"]),
    "add_path": ("vgpu-add-path", ("common",), ["tf-add-path", "path"]),
    # The simulated GPU from the installed wheel: a workload through cuGetProcAddress_v2.
    "limiter": (
        "vgpu-limiter",
        ("common",),
        [
            "tf-limiter",
            "sim",
            "workload",
            "--state",
            str(ROOT / "build" / "check.state"),
            "--path",
            "procaddress",
            "--alloc",
            "1GiB",
            "--kernels",
            "10",
            "--kernel-us",
            "100",
        ],
    ),
    "hypervisor": ("vgpu-hypervisor", ("common", "limiter"), ["tf-hypervisor", "version"]),
}
SANITIZER_FLAGS = [
    "-std=c11",
    "-g",
    "-O1",
    "-fno-omit-frame-pointer",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
]


def sync(session: nox.Session, *groups: str, packages: bool = True) -> None:
    """Install the locked workspace (or only the groups) into the session's environment."""
    selection = ["--all-packages"] if packages else ["--no-install-workspace"]
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--no-default-groups",
        *selection,
        *(f"--group={group}" for group in groups),
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        silent=True,
    )


@nox.session
def tests(session: nox.Session) -> None:
    """pytest over tests/ on the simulated GPU (real-GPU tests skip themselves)."""
    sync(session, "tests")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    sync(session, "lint", packages=False)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over packages/ (and the build and test support code)."""
    sync(session, "typecheck")
    session.run("mypy", *session.posargs)


@nox.session
def protos(session: nox.Session) -> None:
    """Regenerate the gRPC stubs of the vendored kubelet protos (device plugin, PodResources,
    DRA driver)."""
    sync(session, "tests", packages=False)
    session.run("python", "scripts/generate_device_plugin_stubs.py", *session.posargs)


LIMITER_C = ROOT / "packages/limiter/csrc"
# C tests built together with the sources they test: (name, sources, include dirs, environment).
C_TESTS: list[tuple[str, list[Path], list[Path], dict[str, str]]] = [
    (
        "add_path_test",
        [ROOT / "tests/c/add_path_test.c", ROOT / "packages/add_path/csrc/add_path.c"],
        [ROOT / "packages/add_path/csrc"],
        {"LSAN_OPTIONS": f"suppressions={ROOT / 'tests/c/lsan.supp'}:print_suppressions=0"},
    ),
    (
        "sim_driver_test",
        [
            ROOT / "tests/c/sim_driver_test.c",
            *driver_sources(ROOT / "packages/limiter"),
        ],
        [LIMITER_C / "include", LIMITER_C / "common", LIMITER_C / "sim"],
        # Destroyed driver objects are kept on purpose (a stale handle must fail cleanly).
        {"ASAN_OPTIONS": "detect_leaks=0"},
    ),
    (
        "arbiter_policy_test",
        [ROOT / "tests/c/arbiter_policy_test.c", LIMITER_C / "region/arbiter_policy.c"],
        [LIMITER_C / "region", LIMITER_C / "include"],
        {},
    ),
    (
        "limiter_config_test",
        [
            ROOT / "tests/c/limiter_config_test.c",
            *sorted(LIMITER_C.glob("limiter/config*.c")),
            LIMITER_C / "common/vgpu_parse.c",
            LIMITER_C / "common/vgpu_files.c",
        ],
        [LIMITER_C / "common", LIMITER_C / "limiter", LIMITER_C / "include"],
        {},
    ),
    (
        "compute_lock_test",
        [ROOT / "tests/c/compute_lock_test.c", LIMITER_C / "limiter/compute_lock.c"],
        [LIMITER_C / "limiter"],
        {},
    ),
    (
        "limiter_pacing_test",
        [
            ROOT / "tests/c/limiter_pacing_test.c",
            LIMITER_C / "limiter/compute_bucket.c",
            LIMITER_C / "limiter/collectives.c",
        ],
        [LIMITER_C / "limiter", LIMITER_C / "include"],
        {},
    ),
]


@nox.session
def sanitize(session: nox.Session) -> None:
    """The C tests built together with the sources they test, under ASan and UBSan; then the
    limiter's compute and memory tests against a limiter built with both."""
    sync(session, "tests")
    compiler = os.environ.get("CC", "cc")
    build = ROOT / "build" / "sanitize"
    build.mkdir(parents=True, exist_ok=True)
    for name, sources, includes, environment in C_TESTS:
        binary = build / name
        session.run(
            compiler,
            *SANITIZER_FLAGS,
            *(f"-I{folder}" for folder in includes),
            *map(str, sources),
            "-lpthread",
            "-o",
            str(binary),
            external=True,
        )
        session.run(str(binary), external=True, env=environment)
    library = build / "libcuda_limiter.so"
    session.run(
        compiler,
        *SANITIZER_FLAGS,
        *("-fPIC", "-shared", "-fvisibility=hidden"),
        "-DVGPU_API_VISIBILITY=VGPU_EXPORT",
        *(f"-I{LIMITER_C / folder}" for folder in ("include", "common", "limiter")),
        *sorted(map(str, LIMITER_C.glob("limiter/*.c"))),
        *sorted(map(str, LIMITER_C.glob("common/*.c"))),
        *("-ldl", "-lpthread", "-o", str(library)),
        external=True,
    )
    # A program that is not built with ASan needs its runtime loaded first.
    runtime = subprocess.run(
        [compiler, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    session.run(
        "pytest",
        "tests/limiter/test_compute_limits.py",
        "tests/limiter/test_memory_limits.py",
        "tests/limiter/test_nvml_processes.py",
        "tests/limiter/test_stress.py",
        "tests/limiter/test_lease_files.py",
        "tests/limiter/test_lease_adversary.py",
        "tests/limiter/test_lease_broker.py",
        env={
            "VGPU_TEST_LIMITER": str(library),
            "VGPU_TEST_PRELOAD_FIRST": runtime,
            # Programs under test are not built with ASan: their own leaks are not ours.
            "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        },
    )


def _venv(session: nox.Session, folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(folder), external=True, silent=True)
    return folder / "bin"


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Wheel and sdist of every package; each wheel installs into a fresh venv and runs."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # Wheels are built from the sdists, so an sdist that misses a file fails here.
    session.run("uv", "build", "--all-packages", "--out-dir", str(dist), external=True)
    venvs = ROOT / "build" / "venvs"
    (ROOT / "build" / "check.state").unlink(missing_ok=True)
    for folder, (distribution, needs, command) in PACKAGES.items():
        stem = distribution.replace("-", "_")
        if not list(dist.glob(f"{stem}-*.tar.gz")):
            session.error(f"no sdist of {distribution}")
        wheels = [
            next(dist.glob(f"{name.replace('-', '_')}-*.whl"))
            for name in (PACKAGES[n][0] for n in (*needs, folder))
        ]
        bin_dir = _venv(session, venvs / folder)
        session.run(
            str(bin_dir / "python"), "-m", "pip", "install", "-q", *map(str, wheels), external=True
        )
        session.run(str(bin_dir / command[0]), *command[1:], external=True)
    # Plain pip from each source folder, alone, in a fresh venv (siblings come from the checkout).
    for folder, (_, _, command) in PACKAGES.items():
        bin_dir = _venv(session, venvs / f"pip-{folder}")
        session.run(
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            str(ROOT / "packages" / folder),
            external=True,
        )
        session.run(str(bin_dir / command[0]), *command[1:], external=True)
    _check_add_path_example(session, venvs / "pip-add_path" / "bin")
    _check_bare_metal_daemon(session, venvs / "pip-hypervisor" / "bin")


def _check_bare_metal_daemon(session: nox.Session, bin_dir: Path) -> None:
    """`pip install ./packages/hypervisor` brings no gRPC and no Kubernetes client; the daemon
    asked for the device plugin says in one line which extra to install."""
    for module in ("grpc", "lightkube", "google.protobuf"):
        found = subprocess.run(
            [bin_dir / "python", "-c", f"import {module}"], capture_output=True, check=False
        )
        if found.returncode == 0:
            session.error(f"a bare-metal install of vgpu-hypervisor brings {module}")
    asked = subprocess.run(
        [bin_dir / "tf-hypervisor", "daemon", "--config", "", "--simulate", "--device-plugin"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    wanted = "pip install 'vgpu-hypervisor[kubernetes]'"
    if asked.returncode == 0 or wanted not in asked.stderr or asked.stderr.count("\n") != 1:
        session.error(f"--device-plugin without the extra: {asked.returncode} {asked.stderr!r}")


def _check_add_path_example(session: nox.Session, bin_dir: Path) -> None:
    """LD_BIND_NOW=1 LD_PRELOAD=$(tf-add-path path) TF_PREPEND_PATH=/opt/a TF_PATH=/opt/b sh."""
    library = subprocess.run(
        [bin_dir / "tf-add-path", "path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = subprocess.run(
        ["sh", "-c", "echo $PATH"],
        capture_output=True,
        text=True,
        check=True,
        env={
            "PATH": "/usr/bin:/bin",
            "LD_BIND_NOW": "1",
            "LD_PRELOAD": library,
            "TF_PREPEND_PATH": "/opt/a",
            "TF_PATH": "/opt/b",
        },
    ).stdout.strip()
    if path != "/opt/a:/usr/bin:/bin:/opt/b":
        session.error(f"libadd_path.so from a plain pip install gave PATH={path}")
    session.log(f"pip install ./packages/add_path: PATH={path}")


# Release artefacts: architecture → (vgpu.rs's name for it, C compiler that builds for it).
RELEASE_ARCHES = {"x86_64": ("x64", "cc"), "aarch64": ("arm64", "aarch64-linux-gnu-gcc")}
# Tarball → the library in the installed wheel; vgpu.rs's install steps unpack both in one folder.
TARBALLS = {
    "libadd_path": "vgpu_add_path/libadd_path.so",
    "libcuda_limiter": "vgpu_limiter/libcuda_limiter.so",
}
# The simulator's test doubles may also need the driver's soname and the loader (TLS).
SIMULATOR_NEEDS = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}


@nox.session
def release(session: nox.Session) -> None:
    """sdists, pure wheels, manylinux2014 wheels and vgpu.rs-style tarballs for x86-64 and arm64
    into dist/release; every native file checked, then the artefacts tested on both (arm64 under
    qemu-user)."""
    sync(session, "release")
    dist, work = ROOT / "dist" / "release", ROOT / "build" / "release"
    for folder in (dist, work):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    session.run("uv", "build", "--sdist", "--all-packages", "--out-dir", str(dist), external=True)
    sdists = {
        name: next(dist.glob(f"{PACKAGES[name][0].replace('-', '_')}-*.tar.gz"))
        for name in PACKAGES
    }
    native = ("add_path", "limiter")
    for name in sorted(PACKAGES.keys() - set(native)):
        session.run(
            "uv", "build", "--wheel", str(sdists[name]), "--out-dir", str(dist), external=True
        )
    for arch, (short, compiler) in RELEASE_ARCHES.items():
        raw, site = work / arch / "raw", work / arch / "site"
        for name in native:
            session.run(
                "uv",
                "build",
                "--wheel",
                str(sdists[name]),
                "--out-dir",
                str(raw),
                f"--config-setting=--build-option=--plat-name=linux_{arch}",
                env={"CC": compiler},
                external=True,
            )
        for wheel in sorted(raw.glob("*.whl")):
            # The workload links the simulated libcuda.so.1, as a CUDA program links the real one.
            session.run(
                "auditwheel",
                "repair",
                "--plat",
                "auto",
                "--exclude",
                "libcuda.so.1",
                "--wheel-dir",
                str(dist),
                str(wheel),
            )
        for wheel in sorted(dist.glob(f"*_{arch}.whl")):
            if f"manylinux2014_{arch}" not in wheel.name:
                session.error(f"{wheel.name}: not manylinux2014 (auditwheel show {wheel})")
            unpack_wheel(wheel, site)
        libraries = sorted(site.rglob("*.so*"))
        preload = [
            site / path
            for path in (
                "vgpu_add_path/libadd_path.so",
                "vgpu_limiter/libcuda_limiter.so",
                "vgpu_limiter/libvgpu_region.so",
            )
        ]
        checker = ["python", str(ROOT / "build_support" / "native_check.py"), "--arch", arch]
        session.run(*checker, *map(str, preload))
        simulator = [*(p for p in libraries if p not in preload), *site.glob("*/sim/bin/*")]
        session.run(
            *checker,
            "--also-needed=libcuda.so.1",
            f"--also-needed={SIMULATOR_NEEDS[arch]}",
            *map(str, simulator),
        )
        for name, path in TARBALLS.items():
            write_tarball(dist / f"{name}-{short}.tar.gz", name, site / path, arch)
    write_sums(dist)
    # As README says: pip install from the release folder into a fresh venv, on this machine.
    bin_dir = _venv(session, work / "venv")
    session.run(
        str(bin_dir / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--find-links",
        str(dist),
        "vgpu-hypervisor",
        "vgpu-add-path",
        external=True,
    )
    (ROOT / "build" / "check.state").unlink(missing_ok=True)
    for _, _, command in PACKAGES.values():
        session.run(str(bin_dir / command[0]), *command[1:], external=True)
    session.run(
        "pytest",
        "tests/release",
        *session.posargs,
        env={"VGPU_RELEASE_DIR": str(work), "VGPU_RELEASE_DIST": str(dist)},
    )
