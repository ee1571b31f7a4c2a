"""The limiter's table of CUDA driver entry points (cuda_api.h), read for tests."""

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

LIMITER = Path(__file__).resolve().parents[2] / "packages" / "limiter"
INCLUDE = LIMITER / "csrc" / "include"

_BALANCED = r"\((?:[^()]|\([^()]*\))*\)"
_ROW = re.compile(rf"X\((\w+),\s*(\w+),\s*(\d+),\s*(\w+),\s*({_BALANCED}),\s*({_BALANCED})\)")


@dataclass(frozen=True)
class Entry:
    symbol: str
    base: str
    version: int
    stream: str
    params: str
    args: str


def cuda_entries() -> list[Entry]:
    text = (INCLUDE / "cuda_api.h").read_text()
    table = text[text.index("#define VGPU_CUDA_API(X)") : text.index("#define VGPU_CUDA_DECLARE")]
    rows = _ROW.findall(table.replace("\\\n", " "))
    return [Entry(s, b, int(v), k, p, a) for s, b, v, k, p, a in rows]


def official_include(header: str) -> Path:
    """The folder of an official NVIDIA header installed from PyPI (nvidia-cuda-runtime ships
    cuda.h, nvidia-nvml-dev ships nvml.h)."""
    nvidia = importlib.import_module("nvidia")  # the namespace package of NVIDIA's wheels
    for root in nvidia.__path__:
        for found in sorted(Path(root).glob(f"*/include/{header}")):
            return found.parent
    raise FileNotFoundError(f"{header} from NVIDIA's PyPI packages is not installed")
