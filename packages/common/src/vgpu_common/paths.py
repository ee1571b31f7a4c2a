"""Where the node's shared files live by default (config.h's VGPU_CONFIG_DEFAULT_BASE is the
C side; tests/limiter/test_config.py proves the two equal)."""

from pathlib import Path
from typing import Final

# The pods' regions, {base}/{namespace}/{pod}/shm, and the GPUs' leases and node files.
DEFAULT_BASE: Final = Path("/run/tensor-fusion/shm")
