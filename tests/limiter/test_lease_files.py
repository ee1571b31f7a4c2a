"""The limiter's device lease files on a hostile or full file system: nothing planted in the lease
folder is followed or changed, a full disk is a warning and pacing without exclusivity (never a
SIGBUS, never a file left behind), and only a node file of the daemon's changes what is charged."""

import json
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from vgpu_limiter.lease import DeviceLease, lease_path, node_path
from vgpu_limiter.region import RegionError

from tests.limiter.conftest import WORKLOAD, LimitedEnv, run
from tests.support.tenant import NOBODY, needs_root, tenant_tools

SIM_GPU0 = "GPU-5157a1e0-0000-4000-8000-000000000001"  # the simulator's first GPU
SECRET = b"root's own, mode 0600\n"


@pytest.fixture
def environment(limited_env: LimitedEnv, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir()
    return limited_env(
        SHM_BASE_PATH=str(tmp_path / "base"),
        SHM_PATH=str(tmp_path / "pod"),
        TMPDIR=str(tmp_path / "tmp"),
        TENSOR_FUSION_CUDA_UP_LIMIT='{"0": 50}',
    )


def paced_run(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = run([WORKLOAD, "--kernels", "20", "--kernel-us", "1000"], environment, timeout=30)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert json.loads(result.stdout).get("error") is None, result.stdout
    return result


def plant(folder: Path, kind: str, target: Path) -> None:
    folder.mkdir(parents=True)
    folder.chmod(0o3770)
    planted = folder / SIM_GPU0
    if kind == "symlink":
        planted.symlink_to(target)
    elif kind == "hard link":
        os.link(target, planted)
    elif kind == "fifo":
        os.mkfifo(planted, 0o660)
    else:
        planted.mkdir()


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("symlink", "a symlink"),
        ("hard link", "a file with other links"),
        ("fifo", "not a regular file"),
        ("folder", "not a regular file"),
    ],
)
def test_what_is_planted_in_the_lease_folder_is_not_used(
    environment: dict[str, str], tmp_path: Path, kind: str, said: str
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    plant(Path(environment["SHM_BASE_PATH"]) / ".devices", kind, secret)
    result = paced_run(environment)
    assert secret.read_bytes() == SECRET and stat.S_IMODE(secret.stat().st_mode) == 0o600
    (warning,) = [line for line in result.stderr.splitlines() if "device lease" in line]
    assert f"{SIM_GPU0}: {said}" in warning and "pods of other users are not kept apart" in warning
    private = tmp_path / "tmp" / f"vgpu-devices-{os.geteuid()}"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert (private / SIM_GPU0).stat().st_size == 128
    with pytest.raises(RegionError, match=said):  # the daemon's side keeps the same rules
        DeviceLease.open(environment["SHM_BASE_PATH"], SIM_GPU0)


def test_a_world_writable_folder_of_an_older_version_is_refused(
    environment: dict[str, str],
) -> None:
    folder = Path(environment["SHM_BASE_PATH"]) / ".devices"
    folder.mkdir(parents=True)
    folder.chmod(0o1777)
    result = paced_run(environment)
    assert "world-writable (made by an older version? remove it)" in result.stderr
    assert list(folder.iterdir()) == []


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs filled to the last block (root only: mount)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mount)],
            capture_output=True,
            check=False,
        ).returncode
    ):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (mount / "base").mkdir()
        (mount / "tmp").mkdir()
        filler = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(filler, b"\0" * 512):
                pass
        except OSError:
            pass  # full
        finally:
            os.close(filler)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_a_warning_and_pacing_goes_on(
    environment: dict[str, str], full_disk: Path
) -> None:
    environment |= {"SHM_BASE_PATH": str(full_disk / "base"), "TMPDIR": str(full_disk / "tmp")}
    result = run([WORKLOAD, "--kernels", "20", "--kernel-us", "1000"], environment, timeout=30)
    assert result.returncode != -signal.SIGBUS and result.returncode == 0, result.stderr
    assert "no space left to allocate it" in result.stderr
    assert "compute pacing without exclusivity" in result.stderr
    assert list((full_disk / "base" / ".devices").iterdir()) == []  # nothing half made is left
    with pytest.raises(RegionError, match="cannot allocate it: No space left on device"):
        DeviceLease.open(full_disk / "base", SIM_GPU0)
    assert list((full_disk / "base" / ".devices").iterdir()) == []


def share(environment: dict[str, str], limit: int) -> tuple[float, str]:
    """Percent of the GPU a 1-ms kernel loop got in 2 s, and what the limiter said."""
    environment = environment | {"TENSOR_FUSION_CUDA_UP_LIMIT": json.dumps({"0": limit})}
    result = run([WORKLOAD, "--duration", "2", "--kernel-us", "1000"], environment, timeout=60)
    return float(json.loads(result.stdout)["achieved_kernels_per_s"]) / 10, result.stderr


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("owner", "not the daemon's (owned by neither root nor the folder's owner)"),
        ("group-writable", "writable by others than its owner"),
    ],
)
def test_a_node_file_the_daemon_does_not_own_alone_is_not_applied(
    environment: dict[str, str], change: str, said: str
) -> None:
    """The daemon's boost of 2 would make a 40 % pod get 20 %; from a node file that another user
    owns or could write, it is not applied (a busy machine takes points off, never adds)."""
    base = environment["SHM_BASE_PATH"]
    with DeviceLease.open(base, SIM_GPU0) as lease:
        lease.publish_boost(2.0)
        path = node_path(base, SIM_GPU0)
        if change == "owner":
            os.chown(path, 65534, -1)
        else:
            path.chmod(0o664)
        got, stderr = share(environment, 40)
    assert 30 < got < 43, got
    assert f"node file {path}: {said}; the GPU's boost is not applied" in stderr
    assert lease_path(base, SIM_GPU0).exists()


@needs_root
def test_a_user_outside_the_lease_group_paces_with_a_lease_of_its_own(
    environment: dict[str, str],
) -> None:
    """The daemon (root) made the leases root's group's: another user's pod cannot write them
    (nor plant anything beside them), says so at info level and uses a 0700 lease of its own.
    The programs run from copies any user can read, wherever the checkout lives."""
    with tenant_tools() as tools:
        top = tools.root / "node"
        for name, mode in [("pod", 0o700), ("tmp", 0o1777)]:
            (top / name).mkdir()
            (top / name).chmod(mode)
        os.chown(top / "pod", NOBODY, NOBODY)  # the pod's own folder, as the daemon gives it
        DeviceLease.open(top / "base", SIM_GPU0).close()
        shared = lease_path(top / "base", SIM_GPU0).read_bytes()
        environment |= {
            "VGPU_SIM_STATE": str(top / "tmp" / "node.state"),
            "SHM_BASE_PATH": str(top / "base"),
            "SHM_PATH": str(top / "pod"),
            "TMPDIR": str(top / "tmp"),
        }
        said = {}
        for level in ("warn", "info"):
            process = tools.run_as_tenant(
                [str(tools.workload), "--kernels", "20", "--kernel-us", "1000"],
                environment | {"TF_LOG_LEVEL": level},
            )
            _, err = process.communicate(timeout=30)
            assert process.returncode == 0, err
            said[level] = [line for line in err.splitlines() if "device lease" in line]
        assert said["warn"] == []
        (line,) = said["info"]
        assert "Permission denied; pods of other users are not kept apart: using " in line
        own = top / "tmp" / f"vgpu-devices-{NOBODY}"
        assert (own.stat().st_uid, stat.S_IMODE(own.stat().st_mode)) == (NOBODY, 0o700)
        assert (own / SIM_GPU0).stat().st_size == 128
        assert lease_path(top / "base", SIM_GPU0).read_bytes() == shared
