"""The pod region from Python (vgpu_limiter.region) against the C header and the C protocols."""

import json
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner
from vgpu_common.limits import normalize_uuid
from vgpu_limiter import region as regions
from vgpu_limiter.config import environment_names
from vgpu_limiter.region import ProcessInfo, Region, RegionError
from vgpu_limiter.region_cli import inspect

INCLUDE = Path(__file__).resolve().parents[2] / "packages/limiter/csrc/include"
UUIDS = [f"GPU-5157a1e0-0000-4000-8000-{index:012x}" for index in range(1, 18)]
GiB = 1 << 30
CC = shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")
FORK = multiprocessing.get_context("fork")


# Helpers


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return regions.region_path(tmp_path / "base", "team", "train")


@pytest.fixture
def region(path: Path) -> Iterator[Region]:
    with regions.create_region(path, "team", "train", {UUIDS[0]: (4 * GiB, 5000)}) as opened:
        yield opened


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (fields restart after the command's last ")")."""
    text = Path(f"/proc/{pid}/stat").read_bytes()
    return int(text[text.rfind(b")") + 1 :].split()[19])


def compile_c(folder: Path, name: str, source: str) -> Path:
    assert CC is not None
    (folder / f"{name}.c").write_text(source)
    program = folder / name
    subprocess.run(
        [CC, "-std=c11", "-O2", "-Wall", "-Werror", f"-I{INCLUDE}", "-o", program, f"{name}.c"],
        cwd=folder,
        check=True,
    )
    return program


@contextmanager
def raw(path: Path) -> Iterator[Any]:
    """The region file mapped as a C process maps it, for writing what C would write."""
    with path.open("r+b") as stream:
        import mmap

        mapping = mmap.mmap(stream.fileno(), regions.REGION_SIZE)
        pointer: Any = regions.ffi.from_buffer("struct vgpu_region *", mapping)
        try:
            yield pointer
        finally:
            regions.ffi.release(pointer)
            mapping.close()


def claim(
    pointer: Any, slot: int, pid: int, memory: list[int], *, namespace: int = 7, start: int = 11
) -> None:
    """Fill a slot as region.c does (claim, fill, publish) and count its memory in the pod."""
    process = pointer.processes[slot]
    process.pid = regions.SLOT_CLAIMING
    process.pid_namespace = namespace
    process.start_time = start
    process.host_pid = 0
    for device, amount in enumerate(memory):
        process.memory[device] = amount
        pointer.devices[device].memory_used += amount
    process.heartbeat_ns = time.time_ns()
    process.pid = pid


def one_line(error: BaseException) -> str:
    message = str(error)
    assert message and "\n" not in message
    return message


# The layout is the C header's


@needs_cc
def test_layout_and_constants_match_the_c_header(tmp_path: Path) -> None:
    structs = ("vgpu_region_device", "vgpu_region_process", "vgpu_region")
    expected: dict[str, int] = {}
    prints = []
    for struct in structs:
        expected[f"sizeof {struct}"] = regions.ffi.sizeof(f"struct {struct}")
        prints.append(f'printf("sizeof {struct} %zu\\n", sizeof(struct {struct}));')
        for field, _ in regions.ffi.typeof(f"struct {struct}").fields:
            expected[f"offsetof {struct}.{field}"] = regions.ffi.offsetof(f"struct {struct}", field)
            prints.append(
                f'printf("offsetof {struct}.{field} %zu\\n", offsetof(struct {struct}, {field}));'
            )
    for name, value in regions.CONSTANTS.items():
        expected[name] = value
        prints.append(f'printf("{name} %lld\\n", (long long)({name}));')
    source = "\n".join(
        [
            "#include <stdio.h>",
            '#include "vgpu_region_api.h"',
            "int main(void) {",
            *prints,
            "return 0; }",
        ]
    )
    output = subprocess.run(
        [compile_c(tmp_path, "layout", source)], capture_output=True, text=True, check=True
    ).stdout
    measured = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in output.splitlines()}
    assert measured == expected
    assert expected["sizeof vgpu_region"] == regions.REGION_SIZE
    assert expected["offsetof vgpu_region.devices"] == regions.HEADER_SIZE


@needs_cc
def test_every_integer_constant_of_the_header_is_read() -> None:
    assert CC is not None
    macros = subprocess.run(
        [CC, "-std=c11", "-dM", "-E", "-x", "c", str(INCLUDE / "vgpu_region_api.h")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    numeric = re.findall(r"^#define (VGPU_\w+) \(?-?(?:0x)?[0-9a-fA-F]+\w*\)?$", macros, re.M)
    assert set(numeric) == set(regions.CONSTANTS)
    assert regions.SLOT_CLAIMING == -2 and regions.SLOT_RECLAIMING == -1
    assert regions.MAGIC.to_bytes(8, "little") == b"VREGION1"


# Paths and names


@given(st.text(max_size=300))
def test_a_pod_name_is_one_safe_path_component_or_a_clear_error(name: str) -> None:
    try:
        path = regions.region_path("/base", "default", name)
    except ValueError as error:
        assert one_line(error).startswith(f"bad pod name {name!r}")
        return
    assert path.parts == ("/", "base", "default", name, "shm")
    assert name not in {".", ".."} and len(name.encode()) < regions.NAME_SIZE


@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True))
def test_kubernetes_names_are_accepted(name: str) -> None:
    assert regions.region_path("b", name, name) == Path("b", name, name, "shm")


@pytest.mark.parametrize(
    ("namespace", "pod", "problem"),
    [
        ("..", "p", "bad pod namespace '..'"),
        ("ns", ".", "bad pod name '.'"),
        ("a/b", "p", "bad pod namespace 'a/b'"),
        ("ns", "", "bad pod name ''"),
        ("ns", "-rf", "bad pod name '-rf'"),
        ("ns", "x" * 254, "bad pod name"),
        ("ns", "caf\u00e9", "bad pod name"),
    ],
)
def test_bad_path_components_are_named(namespace: str, pod: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)) as caught:
        regions.region_path("/base", namespace, pod)
    one_line(caught.value)


@given(st.sampled_from(UUIDS), st.randoms())
def test_uuids_are_stored_as_nvml_writes_them(uuid: str, chance: random.Random) -> None:
    mixed = "".join(c.upper() if chance.random() < 0.5 else c.lower() for c in uuid)
    assert normalize_uuid(mixed) == uuid


@pytest.mark.parametrize("uuid", ["", "GPU-1234", "MIG-5157a1e0-0000-4000-8000-000000000001", "x"])
def test_bad_uuids_are_refused(uuid: str) -> None:
    with pytest.raises(ValueError, match="bad GPU UUID"):
        normalize_uuid(uuid)


# Creating and opening


def test_create_then_open_round_trip(path: Path) -> None:
    devices = {UUIDS[0].upper(): (4 * GiB, 2500), UUIDS[1]: (0, 0)}
    before = time.time_ns()
    with regions.create_region(path, "team", "train", devices) as created:
        assert (created.namespace, created.pod, created.version) == ("team", "train", 2)
        assert before <= created.created_ns <= time.time_ns()
    with regions.open_region(path, writable=False) as opened:
        assert [
            (d.uuid, d.memory_limit, d.compute_limit, d.memory_used) for d in opened.devices
        ] == [
            (UUIDS[0], 4 * GiB, 2500, 0),
            (UUIDS[1], 0, 0, 0),
        ]
        assert opened.devices[0].compute_percent == 25.0
        assert opened.devices[1].compute_percent is None
        assert opened.processes == []
    with raw(path) as pointer:
        assert (pointer.magic, pointer.header_size, pointer.total_size) == (
            regions.MAGIC,
            regions.HEADER_SIZE,
            regions.REGION_SIZE,
        )
    assert path.stat().st_size == regions.REGION_SIZE
    assert [entry.name for entry in path.parent.iterdir()] == ["shm"]  # no temporary file left


def test_an_existing_region_is_opened_never_replaced(region: Region, path: Path) -> None:
    inode = path.stat().st_ino
    region.set_limits(UUIDS[0], memory_limit=GiB)
    with regions.create_region(path, "team", "train", {UUIDS[5]: (1, 1)}) as again:
        assert path.stat().st_ino == inode
        assert again.created_ns == region.created_ns
        assert [(d.uuid, d.memory_limit) for d in again.devices] == [(UUIDS[0], GiB)]


def test_the_file_is_shared_by_the_pod_group_whatever_the_umask(path: Path) -> None:
    previous = os.umask(0o077)
    try:
        regions.create_region(path, "team", "train").close()
    finally:
        os.umask(previous)
    # The pod's processes (its user and group) and root; nobody else.
    assert path.stat().st_mode & 0o777 == 0o660
    assert path.parent.stat().st_mode & 0o777 == 0o770


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ({"GPU-0": (1, 1)}, "bad GPU UUID 'GPU-0'"),
        ({UUIDS[0]: (1, 1), UUIDS[0].upper(): (2, 2)}, "is given twice"),
        ({UUIDS[0]: (-1, 0)}, "bad memory limit -1"),
        ({UUIDS[0]: (0, 10001)}, "bad compute limit 10001"),
        ({uuid: (0, 0) for uuid in UUIDS}, "at most 16"),
    ],
)
def test_bad_devices_are_refused_before_any_file_is_made(
    path: Path, devices: dict[str, tuple[int, int]], problem: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)) as caught:
        regions.create_region(path, "team", "train", devices)
    one_line(caught.value)
    assert not path.parent.exists()


def test_a_folder_that_cannot_be_made_is_a_region_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(RegionError, match="cannot create the pod folder: Not a directory"):
        regions.create_region(tmp_path / "file" / "ns" / "pod" / "shm", "ns", "pod")


def _create_and_report(path: Path, index: int, barrier: Any, results: Any) -> None:
    barrier.wait()
    with regions.create_region(path, "team", "train", {UUIDS[index]: (index * GiB, 0)}) as made:
        results.put((made.created_ns, path.stat().st_ino, made.devices[0].uuid))


def test_concurrent_creators_make_one_region_and_agree(path: Path) -> None:
    count = 8
    barrier, results = FORK.Barrier(count), FORK.Queue()
    workers = [
        FORK.Process(target=_create_and_report, args=(path, i, barrier, results))
        for i in range(count)
    ]
    for worker in workers:
        worker.start()
    seen = {results.get(timeout=30) for _ in workers}
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    assert len(seen) == 1
    assert [entry.name for entry in path.parent.iterdir()] == ["shm"]


# Corrupt files: one line naming the file and the problem, never a traceback


def _corrupt(path: Path, change: Callable[[bytearray], bytes]) -> None:
    regions.create_region(path, "team", "train").close()
    path.write_bytes(change(bytearray(path.read_bytes())))


def _set(offset_field: str, value: int, size: int) -> Callable[[bytearray], bytes]:
    def change(data: bytearray) -> bytes:
        offset = regions.ffi.offsetof("struct vgpu_region", offset_field)
        data[offset : offset + size] = value.to_bytes(size, "little")
        return bytes(data)

    return change


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda data: b"", "too small for a pod region (0 bytes)"),
        (lambda data: bytes(data[:100]), "too small for a pod region (100 bytes)"),
        (lambda data: bytes(data[:5000]), "truncated (5000 of 299952 bytes)"),
        (_set("magic", 0x1234, 8), "not a pod region (bad magic)"),
        (_set("version", 1, 4), "region version 1, this vgpu-limiter reads version 2"),
        (
            _set("total_size", 99, 8),
            "unexpected layout (header 688, total 99 bytes; expected 688 and 299952)",
        ),
        (
            _set("header_size", 12, 4),
            "unexpected layout (header 12, total 299952 bytes; expected 688 and 299952)",
        ),
        (_set("device_count", 17, 4), "corrupt device table (device_count 17)"),
        (lambda data: random.Random(4).randbytes(len(data)), "not a pod region (bad magic)"),
    ],
)
def test_corrupt_files_are_one_line_errors(
    path: Path, change: Callable[[bytearray], bytes], problem: str
) -> None:
    _corrupt(path, change)
    for writable in (True, False):
        with pytest.raises(RegionError) as caught:
            regions.open_region(path, writable=writable)
        assert one_line(caught.value) == f"{path}: {problem}"


def test_missing_files_and_folders_are_region_errors(tmp_path: Path) -> None:
    with pytest.raises(RegionError, match="no such pod region"):
        regions.open_region(tmp_path / "nothing")
    with pytest.raises(RegionError, match="not a regular file"):
        regions.open_region(tmp_path, writable=False)


@given(st.binary(max_size=2048))
def test_random_headers_never_get_past_the_checks(data: bytes) -> None:
    header: Any = regions.ffi.from_buffer(
        "struct vgpu_region *", bytearray(data.ljust(regions.REGION_SIZE, b"\0"))
    )
    assert regions._problem(header, len(data)) is not None


# Limits: the seqlock


def test_limits_change_live_and_the_generation_moves_by_two(region: Region) -> None:
    changed = region.set_limits(UUIDS[0].upper(), compute_limit=1250)
    assert (changed.memory_limit, changed.compute_limit, changed.generation) == (4 * GiB, 1250, 2)
    changed = region.set_limits(UUIDS[0], memory_limit=GiB)
    assert (changed.memory_limit, changed.compute_limit, changed.generation) == (GiB, 1250, 4)
    with regions.open_region(region.path, writable=False) as other:
        assert other.device(UUIDS[0]) == changed


def test_bad_limit_changes(region: Region) -> None:
    with pytest.raises(RegionError, match=f"no entry for GPU {UUIDS[3]}"):
        region.set_limits(UUIDS[3], memory_limit=1)
    with pytest.raises(ValueError, match="bad compute limit"):
        region.set_limits(UUIDS[0], compute_limit=-5)
    with (
        regions.open_region(region.path, writable=False) as read_only,
        pytest.raises(RegionError, match="opened read-only"),
    ):
        read_only.set_limits(UUIDS[0], memory_limit=1)


def test_a_writer_that_died_mid_change_does_not_wedge_readers(region: Region) -> None:
    with raw(region.path) as pointer:
        pointer.devices[0].generation = 7  # odd: a writer killed between its stores
    started = time.monotonic()
    assert region.devices[0].generation == 7  # bounded retries, then the values as they are
    assert time.monotonic() - started < 5
    assert region.settle_generations() == 1
    assert region.devices[0].generation == 8
    with raw(region.path) as pointer:
        pointer.devices[0].generation = 9
    assert region.set_limits(UUIDS[0], compute_limit=100).generation == 10


SEQLOCK_READER = r"""
#define _GNU_SOURCE
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include "vgpu_region_api.h"

/* Reads device 0's limits as the limiter does for `seconds`; every read must satisfy
 * memory_limit == compute_limit * factor, which the writer keeps. */
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDONLY);
    double seconds = atof(argv[2]);
    uint64_t factor = strtoull(argv[3], NULL, 10);
    struct vgpu_region *region = mmap(NULL, sizeof *region, PROT_READ, MAP_SHARED, fd, 0);
    struct vgpu_region_device *device = &region->devices[0];
    unsigned long reads = 0, torn = 0, changes = 0;
    uint32_t last = 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        uint32_t before, after;
        uint64_t memory;
        uint32_t compute;
        do {
            before = atomic_load(&device->generation);
            memory = atomic_load(&device->memory_limit);
            compute = atomic_load(&device->compute_limit);
            after = atomic_load(&device->generation);
        } while ((before & 1) != 0 || before != after);
        reads++;
        torn += memory != compute * factor;
        changes += before != last;
        last = before;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    printf("{\"reads\": %lu, \"torn\": %lu, \"changes\": %lu}\n", reads, torn, changes);
    return 0;
}
"""
FACTOR = 1_000_003


def _write_limits_until(region: Region, done: Callable[[], bool]) -> int:
    writes = 0
    while not done():
        compute = writes % 10000 + 1
        region.set_limits(UUIDS[0], memory_limit=compute * FACTOR, compute_limit=compute)
        writes += 1
    return writes


@needs_cc
def test_c_readers_see_both_limits_of_one_change(region: Region, tmp_path: Path) -> None:
    region.set_limits(UUIDS[0], memory_limit=FACTOR, compute_limit=1)
    program = compile_c(tmp_path, "reader", SEQLOCK_READER)
    reader = subprocess.Popen(
        [program, str(region.path), "1.5", str(FACTOR)], stdout=subprocess.PIPE, text=True
    )
    writes = _write_limits_until(region, lambda: reader.poll() is not None)
    report = json.loads(reader.communicate(timeout=30)[0])
    assert report["torn"] == 0
    assert report["changes"] > 100 and writes > 100


def _read_limits(path: Path, seconds: float, results: Any) -> None:
    reads = torn = 0
    with regions.open_region(path, writable=False) as region:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            device = region.devices[0]
            reads += 1
            torn += device.memory_limit != device.compute_limit * FACTOR
    results.put((reads, torn))


def test_python_readers_see_both_limits_of_one_change(region: Region) -> None:
    region.set_limits(UUIDS[0], memory_limit=FACTOR, compute_limit=1)
    results = FORK.Queue()
    reader = FORK.Process(target=_read_limits, args=(region.path, 1.5, results))
    reader.start()
    _write_limits_until(region, lambda: not reader.is_alive())
    reads, torn = results.get(timeout=30)
    reader.join()
    assert torn == 0 and reads > 100


def test_a_reader_waits_for_a_writer_preempted_mid_change(region: Region) -> None:
    """A writer descheduled between its stores (a busy host) keeps the generation odd for
    milliseconds: the reader waits for the whole change instead of returning half of it."""
    import threading

    region.set_limits(UUIDS[0], memory_limit=FACTOR, compute_limit=1)
    started = threading.Event()
    with raw(region.path) as pointer:
        device = pointer.devices[0]

        def write_slowly() -> None:
            generation = int(device.generation)
            device.generation = generation + 1  # odd: a change begins
            device.memory_limit = 2 * FACTOR
            started.set()
            time.sleep(0.005)  # preempted here
            device.compute_limit = 2
            device.generation = generation + 2

        writer = threading.Thread(target=write_slowly)
        writer.start()
        started.wait(5)
        seen = region.devices[0]
        writer.join()
    assert (seen.memory_limit, seen.compute_limit) == (2 * FACTOR, 2)


# Device entries


def test_burst_and_device_flags_travel_with_the_limits(path: Path) -> None:
    spec = regions.DeviceLimits(4 * GiB, 3000, 8000, regions.DEVICE_OVERSUBSCRIBE)
    with regions.create_region(path, "team", "train", {UUIDS[0]: spec}) as region:
        device = region.device(UUIDS[0])
        assert device.limits == spec and device.oversubscribe
        changed = region.set_limits(UUIDS[0], compute_limit=2000, device_flags=0)
        assert changed.limits == regions.DeviceLimits(4 * GiB, 2000, 8000, 0)
        added = region.add_device(UUIDS[1], 0, 1000, compute_soft_limit=10000)
        assert (added.compute_limit, added.compute_soft_limit, added.device_flags) == (
            1000,
            10000,
            0,
        )
        with pytest.raises(ValueError, match="below the compute limit"):
            region.set_limits(UUIDS[0], compute_soft_limit=1000)
        with pytest.raises(ValueError, match="unknown device flags"):
            region.set_limits(UUIDS[0], device_flags=0x80)
        assert region.device(UUIDS[0]).limits == changed.limits


def test_devices_are_added_once_and_up_to_the_table_size(region: Region) -> None:
    added = region.add_device(UUIDS[1].upper(), 2 * GiB, 3000)
    assert (added.index, added.uuid, added.memory_limit, added.compute_limit) == (
        1,
        UUIDS[1],
        2 * GiB,
        3000,
    )
    with pytest.raises(RegionError, match="already has an entry"):
        region.add_device(UUIDS[1])
    for uuid in UUIDS[2:16]:
        region.add_device(uuid)
    with pytest.raises(RegionError, match="all 16 device entries are in use"):
        region.add_device(UUIDS[16])
    assert [device.uuid for device in region.devices] == UUIDS[:16]


def test_entries_that_region_c_wrote_in_lower_case_are_found(region: Region) -> None:
    with raw(region.path) as pointer:
        pointer.devices[1].uuid = UUIDS[1].lower().encode()
        pointer.device_count = 2
    assert region.device(UUIDS[1]).uuid == UUIDS[1]
    assert region.set_limits(UUIDS[1], memory_limit=5).memory_limit == 5


# Processes and reaping


def test_processes_are_read_with_their_memory_by_device(region: Region) -> None:
    region.add_device(UUIDS[1])
    with raw(region.path) as pointer:
        claim(pointer, 5, 4242, [GiB, 2 * GiB])
        pointer.processes[6].pid = regions.SLOT_CLAIMING  # not yet a process
        pointer.processes[7].pid = regions.SLOT_RECLAIMING
    [process] = region.processes
    assert (process.slot, process.pid, process.pid_namespace, process.start_time) == (
        5,
        4242,
        7,
        11,
    )
    assert process.memory == {UUIDS[0]: GiB, UUIDS[1]: 2 * GiB}
    assert [device.memory_used for device in region.devices] == [GiB, 2 * GiB]


def _fill(region: Region, alive: int, dead: int) -> tuple[set[int], int]:
    """Slots of alive and dead processes; the dead slots and the live processes' memory."""
    chance = random.Random(alive * 1000 + dead)
    live_memory = 0
    dead_slots = set()
    with raw(region.path) as pointer:
        for slot in range(alive + dead):
            amount = chance.randrange(1, GiB)
            pid = 1000 + slot
            claim(pointer, slot, pid, [amount])
            if slot < alive:
                live_memory += amount
            else:
                dead_slots.add(slot)
    return dead_slots, live_memory


def _alive_below(pid: int) -> Callable[[ProcessInfo], bool]:
    return lambda process: process.pid < pid


def test_reaping_gives_a_dead_process_memory_back_once(region: Region) -> None:
    dead, live_memory = _fill(region, alive=10, dead=5)
    reclaimed = region.reap(_alive_below(1010))
    assert {process.slot for process in reclaimed} == dead
    assert region.devices[0].memory_used == live_memory
    assert [process.slot for process in region.processes] == list(range(10))
    assert region.reap(_alive_below(1010)) == []
    assert region.devices[0].memory_used == live_memory


def _reap_and_report(path: Path, barrier: Any, results: Any) -> None:
    with regions.open_region(path) as region:
        barrier.wait()
        results.put([process.slot for process in region.reap(_alive_below(1100))])


CHURN = r"""
#include <stdatomic.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include "vgpu_region_api.h"

/* Live processes reserving and releasing on device 0 as region.c does, net zero. */
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR);
    long rounds = atol(argv[2]);
    struct vgpu_region *region = mmap(NULL, sizeof *region, PROT_READ | PROT_WRITE, MAP_SHARED,
                                      fd, 0);
    for (long i = 0; i < rounds; i++) {
        uint64_t used = atomic_load(&region->devices[0].memory_used);
        while (!atomic_compare_exchange_weak(&region->devices[0].memory_used, &used, used + 4096)) {
        }
        atomic_fetch_sub(&region->devices[0].memory_used, 4096);
    }
    return 0;
}
"""


@needs_cc
def test_concurrent_reapers_give_memory_back_exactly_once(region: Region, tmp_path: Path) -> None:
    dead, live_memory = _fill(region, alive=100, dead=400)
    churn = compile_c(tmp_path, "churn", CHURN)
    reservers = [subprocess.Popen([churn, str(region.path), "2000000"]) for _ in range(2)]
    count = 6
    barrier, results = FORK.Barrier(count), FORK.Queue()
    reapers = [
        FORK.Process(target=_reap_and_report, args=(region.path, barrier, results))
        for _ in range(count)
    ]
    for reaper in reapers:
        reaper.start()
    slots = [slot for _ in reapers for slot in results.get(timeout=60)]
    for reaper in reapers:
        reaper.join(timeout=30)
    for reserver in reservers:
        assert reserver.wait(timeout=60) == 0
    assert sorted(slots) == sorted(dead)  # each dead slot reclaimed by exactly one reaper
    assert region.devices[0].memory_used == live_memory


def test_a_slot_reused_while_judged_is_not_reclaimed(region: Region) -> None:
    _fill(region, alive=0, dead=1)
    with raw(region.path) as pointer:
        memory_used = int(pointer.devices[0].memory_used)

        def judge_while_the_slot_is_reused(process: ProcessInfo) -> bool:
            # Reclaimed by someone else and claimed by a process of another container with
            # the same pid number, between our look and our reclaim.
            pointer.processes[process.slot].pid_namespace = 99
            return False

        assert region.reap(judge_while_the_slot_is_reused) == []
        assert pointer.processes[0].pid == 1000
    assert region.devices[0].memory_used == memory_used


def test_reaping_needs_a_writable_region(region: Region) -> None:
    with (
        regions.open_region(region.path, writable=False) as read_only,
        pytest.raises(RegionError, match="opened read-only"),
    ):
        read_only.reap()


def test_default_liveness_by_pid_and_start_time(region: Region) -> None:
    own = regions.own_pid_namespace()
    gone = subprocess.Popen(["true"])
    gone.wait()
    me = os.getpid()
    my_start = start_time(me)
    with raw(region.path) as pointer:
        claim(pointer, 0, me, [1], namespace=own, start=my_start)
        claim(pointer, 1, gone.pid, [2], namespace=own, start=my_start)
        claim(pointer, 2, me, [4], namespace=own, start=my_start + 1)  # a reused pid
        claim(pointer, 3, 1, [8], namespace=own + 1)  # another namespace, no host pid
    reclaimed = region.reap()
    assert sorted(process.slot for process in reclaimed) == [1, 2]
    assert region.devices[0].memory_used == 1 + 8


def test_host_pids_are_recorded_only_on_the_same_process(region: Region) -> None:
    _fill(region, alive=1, dead=0)
    [process] = region.processes
    assert region.set_host_pid(process, 31337)
    assert region.processes[0].host_pid == 31337
    with raw(region.path) as pointer:
        pointer.processes[0].start_time = 12  # the slot now holds another process
    assert not region.set_host_pid(process, 1)
    assert region.processes[0].host_pid == 31337


def test_a_closed_region_is_an_error_not_a_crash(path: Path) -> None:
    region = regions.create_region(path, "team", "train")
    region.close()
    region.close()
    with pytest.raises(RegionError, match="closed"):
        _ = region.devices


# tf-limiter inspect


@pytest.fixture
def app() -> typer.Typer:
    application = typer.Typer()

    @application.callback()
    def main() -> None:
        """Stands for tf-limiter."""

    application.command("inspect")(inspect)
    return application


def invoke(app: typer.Typer, *args: str, **environment: str) -> Any:
    clean = dict.fromkeys(environment_names())
    return CliRunner().invoke(
        app, ["inspect", *args], env={**clean, "COLUMNS": "200", **environment}
    )


@pytest.fixture
def busy(region: Region) -> Region:
    with raw(region.path) as pointer:
        claim(pointer, 3, 4242, [3 * GiB // 2])
    return region


def test_inspect_table(app: typer.Typer, busy: Region, tmp_path: Path) -> None:
    result = invoke(app, "team/train", "--base", str(tmp_path / "base"))
    assert result.exit_code == 0, result.stderr
    for text in ("team/train", UUIDS[0], "1.5 GiB", "4.0 GiB", "38%", "50%", "4242"):
        assert text in result.stdout


def test_inspect_json(app: typer.Typer, busy: Region) -> None:
    result = invoke(app, "--path", str(busy.path), "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["namespace"], report["pod"], report["frozen"]) == ("team", "train", False)
    assert report["devices"][0] | {"generation": 0} == {
        "index": 0,
        "uuid": UUIDS[0],
        "memory_limit": 4 * GiB,
        "memory_used": 3 * GiB // 2,
        "compute_limit": 5000,
        "compute_percent": 50.0,
        "compute_soft_limit": 0,
        "oversubscribe": False,
        "host_memory_used": 0,
        "gpu_seconds": 0.0,
        "throttled_seconds": 0.0,
        "burst_seconds": 0.0,
        "generation": 0,
        "refusals": 0,
        "refused_bytes_last": 0,
    }
    [process] = report["processes"]
    assert (process["slot"], process["pid"], process["memory"]) == (
        3,
        4242,
        {UUIDS[0]: 3 * GiB // 2},
    )


def test_inspect_finds_the_pod_from_the_environment(app: typer.Typer, busy: Region) -> None:
    base = str(busy.path.parents[2])
    for environment in (
        {"SHM_BASE_PATH": base, "POD_NAMESPACE": "team", "POD_NAME": "train"},
        {"SHM_PATH": str(busy.path.parent)},
    ):
        result = invoke(app, "--json", **environment)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["path"] == str(busy.path)
    result = invoke(app, "train", "--json", SHM_BASE_PATH=base)
    assert result.exit_code == 2
    assert result.stderr == f"error: {base}/default/train/shm: no such pod region\n"


def test_inspect_reads_the_environment_as_the_limiter_does(
    app: typer.Typer, busy: Region, tmp_path: Path
) -> None:
    """Before, inspect knew SHM_PATH and POD_NAME only, and took a relative SHM_BASE_PATH,
    which the limiter refuses, to say "no such pod region"."""
    result = invoke(app, "--json", TF_SHM_FILE=str(busy.path))
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["path"] == str(busy.path)
    base = str(busy.path.parents[2])
    result = invoke(app, "--json", "--base", base, POD_NAMESPACE="team", POD_NAME="train")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["path"] == str(busy.path)
    for args, environment in (
        ([], {"SHM_BASE_PATH": "relative/base", "POD_NAME": "train"}),
        (["team/train"], {"SHM_BASE_PATH": "relative/base"}),
    ):
        result = invoke(app, *args, **environment)
        assert result.exit_code == 2
        assert result.stderr == "error: SHM_BASE_PATH=relative/base: must be an absolute path\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["../etc"], "error: bad pod namespace '..'"),
        (["team/"], "error: bad pod name ''"),
        (["a/b/c"], "error: bad pod namespace 'a/b'"),
        (["x", "--path", "/tmp/shm"], "error: give a POD or --path, not both"),
        ([], "error: name a POD (namespace/name) or --path FILE"),
        (["--path", "/nonexistent/shm"], "error: /nonexistent/shm: no such pod region"),
    ],
)
def test_inspect_errors_are_one_line(app: typer.Typer, args: list[str], message: str) -> None:
    result = invoke(app, *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_inspect_a_corrupt_region(app: typer.Typer, path: Path) -> None:
    _corrupt(path, _set("magic", 0, 8))
    result = invoke(app, "--path", str(path))
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: {path}: not a pod region (bad magic)\n",
    )


def test_inspect_shows_names_from_the_file_verbatim(app: typer.Typer, path: Path) -> None:
    regions.create_region(path, "team", "train").close()
    with raw(path) as pointer:
        pointer.pod_name = b"[bold]x[/]"  # as a corrupt or foreign file could hold
    result = invoke(app, "--path", str(path))
    assert result.exit_code == 0, result.stderr
    assert "team/[bold]x[/]" in result.stdout
