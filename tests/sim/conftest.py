"""Fixtures for tests on the simulated GPU: each test gets its own node (state file)."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from vgpu_limiter import sim

SimEnv = Callable[..., dict[str, str]]


@pytest.fixture
def sim_state_path(tmp_path: Path) -> Path:
    return tmp_path / "sim.state"


@pytest.fixture
def sim_env(sim_state_path: Path) -> SimEnv:
    """sim_env(devices=None, **extra) → a full environment for a subprocess on a fresh node."""

    def make(devices: str | None = None, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_SIM_", "TF_"))}
        return base | sim.environment(devices=devices, state=sim_state_path, base=base) | extra

    return make
