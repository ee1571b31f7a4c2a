"""Pod names as the CLI checks them before asking the daemon, explained in words.

The rule is the region's (vgpu_limiter.region.check_name, also the API's NAME_PATTERN): 1-253
letters, digits, '.', '_' and '-', starting with a letter, digit or '_'. It is wider than
Kubernetes' DNS-1123 rules on purpose: every Kubernetes pod and namespace name fits, and so do
the names other tools on the node already gave their pods' folders (upper case, '_'), which a
narrower rule would leave unlisted and undeletable.
"""

import re

from vgpu_common.cli import fail

RULE = "1-253 letters, digits, '.', '_' and '-', starting with a letter, digit or '_'"


def check_pod_name(kind: str, value: str, given: str) -> str:
    """``value`` if it is a valid pod name or namespace; else exit 2 naming what was typed."""
    from vgpu_hypervisor.models import NAME_PATTERN  # the API's models: only where needed

    if not re.fullmatch(NAME_PATTERN, value, re.ASCII) or value in (".", ".."):
        where = "" if given == value else f" (in {given!r})"
        fail(f"bad {kind} {value!r}{where}: use {RULE}")
    return value
