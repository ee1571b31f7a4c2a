from pathlib import Path

import pytest
from vgpu_add_path import library_path


@pytest.fixture(scope="session")
def libadd_path() -> Path:
    return library_path()
