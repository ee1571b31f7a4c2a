"""Numbers the docs state about the layout, checked against the layout itself."""

import re
from pathlib import Path

from vgpu_limiter.region import REGION_SIZE

DOCS = Path(__file__).parents[2] / "docs"


def test_the_region_size_in_the_limiter_docs_is_the_layouts() -> None:
    stated = re.search(r"One file per pod, ([\d,]+) bytes", (DOCS / "limiter.md").read_text())
    assert stated is not None
    assert int(stated[1].replace(",", "")) == REGION_SIZE
