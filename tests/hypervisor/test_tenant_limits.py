"""A tenant cannot raise the limits the daemon set for its pod, even in a pod made with `--owner`
(the region is then the tenant's): not by lowering the context charge in its environment, and
not by removing the region and letting its limiter make one with limits of its own. The tenant
is the unprivileged user `nobody`; the daemon runs as root, as on a node."""

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from vgpu_limiter.region import open_region

from tests.hypervisor.conftest import Daemon, wait_for
from tests.support.tenant import NOBODY, TenantTools, needs_root, tenant_tools

GiB = 1 << 30
DEFAULT_OVERHEAD = 544 << 20  # VGPU_CONFIG_DEFAULT_CONTEXT_OVERHEAD

pytestmark = needs_root


@pytest.fixture
def tools() -> Iterator[TenantTools]:
    with tenant_tools() as made:
        yield made


@pytest.fixture
def node(tools: TenantTools) -> Iterator[Daemon]:
    running = Daemon(tools.root / "node")
    running.start()
    running.state.chmod(0o666)  # the simulated GPU's shared state: every process writes it
    try:
        created = running.cli(
            "pods", "create", "mine", "--mem", "0=2GiB", "--owner", f"{NOBODY}:{NOBODY}"
        )
        assert created.returncode == 0, created.stderr
        yield running
    finally:
        running.close()


def _holders(
    node: Daemon, tools: TenantTools, count: int, **extra: str
) -> list["subprocess.Popen[str]"]:
    environment = node.workload_environment("mine", **extra)
    return [
        tools.run_as_tenant(
            [str(tools.workload), "--alloc", "1GiB", "--kernels", "1", "--hold", "60"],
            environment,
        )
        for _ in range(count)
    ]


def _reports(processes: list["subprocess.Popen[str]"]) -> list[dict[str, object]]:
    reports = []
    for process in processes:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.communicate(timeout=30)[1]
        reports.append(json.loads(line))
    return reports


def _stop(processes: list["subprocess.Popen[str]"]) -> list[str]:
    errors = []
    for process in processes:
        process.terminate()
        errors.append(process.communicate(timeout=30)[1])
    return errors


def test_a_tenant_cannot_lift_the_context_charge(node: Daemon, tools: TenantTools) -> None:
    """Before, five processes with TF_CUDA_CONTEXT_OVERHEAD=0 held 10 GiB under 2 GiB."""
    processes = _holders(node, tools, 5, TF_CUDA_CONTEXT_OVERHEAD="0")
    try:
        reports = _reports(processes)
        with open_region(node.base / "default" / "mine" / "shm", writable=False) as region:
            used = region.devices[0].memory_used
            charged = [sum(process.memory.values()) for process in region.processes]
    finally:
        errors = _stop(processes)
    allocated = [report for report in reports if report.get("error") is None]
    # Each context is charged at the default at least: one 1 GiB holder fits in 2 GiB, and the
    # others' contexts or allocations are refused.
    assert len(allocated) == 1, reports
    assert used <= 2 * GiB
    assert all(charge >= DEFAULT_OVERHEAD for charge in charged if charge), charged
    assert all("ignored: below the default" in error for error in errors), errors[0]


def test_a_tenant_cannot_replace_the_region_made_for_it(node: Daemon, tools: TenantTools) -> None:
    """Before, the tenant removed the daemon's region, its limiter made one with a 14 GiB limit
    from the environment, and the daemon adopted that."""
    folder = node.base / "default" / "mine"
    remove = tools.run_as_tenant(
        ["/bin/sh", "-c", f"rm -f {folder / 'shm'}; mv {folder / 'shm'} {folder / 'old'}"], {}
    )
    _, said = remove.communicate(timeout=30)
    assert remove.returncode != 0 and said.count("Permission denied") == 2, said
    processes = _holders(node, tools, 3, TENSOR_FUSION_CUDA_MEM_LIMIT='{"0": "14GiB"}')
    try:
        reports = _reports(processes)
    finally:
        _stop(processes)
    assert sum(report.get("error") is None for report in reports) == 1, reports
    with open_region(folder / "shm", writable=False) as region:
        assert region.devices[0].memory_limit == 2 * GiB
    listed = node.cli("pods", "get", "mine", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert str(2 * GiB) in listed.stdout or "2.0 GiB" in listed.stdout, listed.stdout
    assert Path(folder / "shm").stat().st_uid == NOBODY


def test_a_tenant_that_grows_its_region_has_it_cut_back(node: Daemon, tools: TenantTools) -> None:
    """A region is the tenant's to write, on a file system that is the node's: before, a tenant
    that grew its own region (in length, or in space held past its end) kept what it took, and
    could fill the base's tmpfs for every pod. The daemon cuts it back at its next pass, says so
    once, and the pod's processes go on."""
    path = node.base / "default" / "mine" / "shm"
    size = path.stat().st_size
    grow = (
        "import ctypes, os\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
        "os.pwrite(fd, b'x' * (8 << 20), 64 << 20)\n"  # 72 MiB long, 8 MiB written past the end
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(200 << 20))\n"  # KEEP_SIZE
        "print(os.fstat(fd).st_blocks * 512)\n"
    )
    grown = tools.run_as_tenant(["python3", "-c", grow], {})
    held, said = grown.communicate(timeout=30)
    assert grown.returncode == 0, said
    assert int(held) >= 8 << 20  # the tenant did grow it
    wait_for(lambda: path.stat().st_size == size and path.stat().st_blocks * 512 < 4 << 20)
    processes = _holders(node, tools, 1)
    try:
        assert _reports(processes)[0].get("error") is None
    finally:
        _stop(processes)
    log = node.log_file.read_text()
    assert log.count("past its") == 1 and "cut back" in log, log
    assert node.cli("pods", "get", "mine").returncode == 0
