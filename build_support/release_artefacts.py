"""Release tarballs in vgpu.rs's layout, and the SHA-256 lists that go with them.

``libcuda_limiter-x64.tar.gz`` unpacks, in the current folder, to ``libcuda_limiter.so`` (the
path vgpu.rs's install steps then preload), ``README.libcuda_limiter`` and
``SHA256SUMS.libcuda_limiter``. The README and the list carry the library's name so that both
tarballs unpack into one folder, as those steps do, without one overwriting the other's.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

READMES = {
    "libadd_path": """libadd_path.so ({arch}): rewrites PATH, LD_PRELOAD and
LD_LIBRARY_PATH of every process it is preloaded into from the TF_* variables.

  LD_PRELOAD=$PWD/libadd_path.so TF_PREPEND_PATH=/opt/a TF_PATH=/opt/b sh -c 'echo $PATH'
  # /opt/a:<PATH>:/opt/b

Needs glibc 2.17 or newer, nothing else. Check the download: sha256sum -c SHA256SUMS.libadd_path
""",
    "libcuda_limiter": """libcuda_limiter.so ({arch}): per-pod GPU memory and compute
limits for unmodified CUDA programs, preloaded into them.

  export TENSOR_FUSION_CUDA_MEM_LIMIT='{{"0": "4GiB"}}' TENSOR_FUSION_CUDA_UP_LIMIT='{{"0": 50}}'
  LD_PRELOAD=$PWD/libcuda_limiter.so your_cuda_application

Needs glibc 2.17 or newer and the NVIDIA driver, nothing else. Check the download:
sha256sum -c SHA256SUMS.libcuda_limiter
""",
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _add(archive: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    # Fixed owner and time: the same inputs give the same tarball.
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    archive.addfile(info, io.BytesIO(data))


def write_tarball(target: Path, name: str, library: Path, arch: str) -> None:
    """``name``-ARCH.tar.gz holding ``name``.so, its README and its SHA-256 list."""
    data = library.read_bytes()
    readme = READMES[name].format(arch=arch).encode()
    sums = f"{_sha256(data)}  {name}.so\n{_sha256(readme)}  README.{name}\n".encode()
    with (
        gzip.GzipFile(target, "wb", mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        _add(archive, f"{name}.so", data, 0o755)
        _add(archive, f"README.{name}", readme, 0o644)
        _add(archive, f"SHA256SUMS.{name}", sums, 0o644)


def write_sums(folder: Path) -> Path:
    """SHA256SUMS over every artefact in ``folder`` (sha256sum -c reads it)."""
    lines = [
        f"{_sha256(path.read_bytes())}  {path.name}\n"
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != "SHA256SUMS" and not path.name.startswith(".")
    ]
    target = folder / "SHA256SUMS"
    target.write_text("".join(lines))
    return target


def unpack_wheel(wheel: Path, target: Path) -> None:
    """Unpack a wheel as an installer would, keeping the permissions it records (programs)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            path = Path(archive.extract(member, target))
            mode = member.external_attr >> 16 & 0o777
            if mode and not member.is_dir():
                path.chmod(mode)
