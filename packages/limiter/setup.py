import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_sources import driver_sources, nvml_sources
from vgpu_build import NativeLibrary, setup_package


def sources(pattern: str) -> list[str]:
    return sorted(str(path) for path in Path().glob(pattern))


# The simulator ships in the limiter's wheel: the same glibc 2.17 floor (vgpu_glibc_floor.h), and
# libdl and libpthread stay NEEDED for the glibc versions where its symbols live there (librt's
# clock functions are in libc since 2.17).
GLIBC_FLOOR = {
    "extra_compile_args": ["-include", "vgpu_glibc_floor.h"],
    "extra_link_args": ["-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0"],
}
SIM_OPTIONS = {
    "include_dirs": ["csrc/include", "csrc/common", "csrc/sim"],
    "define_macros": [("VGPU_API_VISIBILITY", "VGPU_EXPORT")],
}


def sim_library(soname: str, sources: list[Path]) -> NativeLibrary:
    # -Bsymbolic: the library's calls to itself never go back through an interposer, as in
    # the real driver; otherwise tests of the limiter could pass for the wrong reason.
    return NativeLibrary(
        f"vgpu_limiter.sim.lib.{soname.split('.', maxsplit=1)[0]}",
        sources=[str(source) for source in sources],
        filename=soname,
        extra_compile_args=GLIBC_FLOOR["extra_compile_args"],
        extra_link_args=[
            f"-Wl,-soname,{soname}",
            "-Wl,-Bsymbolic",
            *GLIBC_FLOOR["extra_link_args"],
        ],
        **SIM_OPTIONS,
    )


# The limiter itself: a plain shared object preloaded into any process.
LIMITER = NativeLibrary(
    "vgpu_limiter.libcuda_limiter",
    sources=[*sources("csrc/limiter/*.c"), *sources("csrc/common/*.c")],
    include_dirs=["csrc/include", "csrc/common", "csrc/limiter"],
    # The wrappers carry the driver's own prototypes; this exports the ones defined.
    define_macros=[("VGPU_API_VISIBILITY", "VGPU_EXPORT")],
    extra_compile_args=["-include", "glibc_compat.h"],
    # libdl and libpthread stay NEEDED: before glibc 2.34 dlsym and friends live there.
    extra_link_args=["-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0"],
)
# The region protocol alone, for the node daemon (through cffi): the interposer, which exports
# dlsym, stays out of the daemon. Same rules as the limiter, but NEEDED libc only.
REGION_LIBRARY = NativeLibrary(
    "vgpu_limiter.libvgpu_region",
    sources=[
        "csrc/limiter/region.c",
        "csrc/limiter/region_file.c",
        "csrc/region/region_api.c",
        "csrc/region/arbiter.c",
        "csrc/region/arbiter_policy.c",
        "csrc/region/arbiter_peer.c",
        "csrc/common/vgpu_proc.c",
        "csrc/common/vgpu_files.c",
    ],
    include_dirs=["csrc/include", "csrc/common", "csrc/limiter"],
    define_macros=[("VGPU_REGION_LIBRARY", None)],
    extra_compile_args=["-include", "glibc_compat.h"],
    # The lease arbiter's thread: before glibc 2.34 pthread_create lives in libpthread.
    extra_link_args=["-Wl,--no-as-needed", "-l:libpthread.so.0"],
)
# The region layout and libvgpu_region.so's prototypes for Python's cffi, from the C headers.
REGION_CDEF = NativeLibrary(
    "vgpu_limiter.region_cdef",
    sources=["csrc/include/vgpu_region_api.h"],
    filename="region_cdef.h",
    preprocess=True,
    define_macros=[("VGPU_REGION_CDEF", None)],
)

setup_package(
    __file__,
    requires=["cffi>=1.16", "rich>=13", "typer>=0.12"],
    siblings=["vgpu-common"],
    native=[
        LIMITER,
        REGION_LIBRARY,
        REGION_CDEF,
        sim_library("libcuda.so.1", driver_sources(Path())),
        sim_library("libnvidia-ml.so.1", nvml_sources(Path())),
        NativeLibrary(
            "vgpu_limiter.sim.bin.workload",
            sources=[*sources("csrc/workload/*.c"), "csrc/common/vgpu_parse.c"],
            filename="vgpu-sim-workload",
            executable=True,
            link_native=("vgpu_limiter.sim.lib.libcuda",),
            include_dirs=["csrc/include", "csrc/common"],
            **GLIBC_FLOOR,
        ),
    ],
)
