"""/readyz says when the base path's filesystem has no room for a pod region."""

from pathlib import Path

from vgpu_hypervisor.daemon.api.context import free_space_problem


def test_a_full_disk_is_reported(small_disk: Path) -> None:
    problem = free_space_problem(small_disk)
    assert problem is not None and "less than one pod region" in problem
    assert "\n" not in problem


def test_room_is_ok(tmp_path: Path) -> None:
    assert free_space_problem(tmp_path) is None


def test_a_missing_base_is_named(tmp_path: Path) -> None:
    problem = free_space_problem(tmp_path / "missing")
    assert problem is not None and str(tmp_path / "missing") in problem
