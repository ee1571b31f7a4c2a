"""A claim's opaque parameters for this driver: what capacity does not express.

    apiVersion: gpu.vgpu.io/v1alpha1
    kind: GpuConfig
    burst: 80            # percent: the soft limit while no other pod wants the GPU
    qos: high            # low, medium (the default), high, critical
    weight: 3            # divides contended time (0: the class's weight)
    oversubscribe: true  # past the memory limit, host memory

Given in the DeviceClass (every claim of the class) or the claim (``config[].opaque``), for
every request or some; a later one wins key by key (the class's come first). Anything else is
a ConfigError of one line, shown to the user as the reason the pod cannot start.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from vgpu_common.limits import (
    HUNDREDTHS_PER_PERCENT,
    MAX_WEIGHT,
    Qos,
    parse_percent,
    parse_qos,
    parse_switch,
)

API_VERSION: Final = "gpu.vgpu.io/v1alpha1"
KIND: Final = "GpuConfig"
_KEYS: Final = ("apiVersion", "kind", "burst", "qos", "weight", "oversubscribe")


class ConfigError(ValueError):
    """Parameters the driver cannot take; one line."""


@dataclass(frozen=True)
class GpuConfig:
    burst: int | None = None  # hundredths of a percent
    qos: Qos | None = None
    weight: int | None = None
    oversubscribe: bool = False


def parse_config(parameters: Mapping[str, Any], where: str) -> dict[str, object]:
    """The keys ``parameters`` set, checked; ConfigError naming ``where`` and the key."""
    if parameters.get("apiVersion") != API_VERSION or parameters.get("kind") != KIND:
        raise ConfigError(
            f"{where}: expected apiVersion {API_VERSION} and kind {KIND}, got "
            f"{parameters.get('apiVersion')!r} and {parameters.get('kind')!r}"
        )
    unknown = sorted(set(parameters) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {_KEYS[2:]}")
    found: dict[str, object] = {}
    for key in _KEYS[2:]:
        if key not in parameters:
            continue
        value = parameters[key]
        try:
            found[key] = _parse(key, value)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{where}: {key} {value!r}: {error}") from None
    return found


def canonical(parameters: Mapping[str, Any], where: str) -> dict[str, object]:
    """``parameters`` as the driver keeps them (its checkpoint): the keys they set, each as
    the driver writes it, which ``parse_config`` reads back to the same values; ConfigError
    as parse_config.

    The tenant writes a claim's parameters, up to what the API server lets through (10 KiB
    each, 32 a claim): a qos of "high" after 5,000 NEL characters (blanks to ``strip``, 2
    bytes each there, 6 in the checkpoint's JSON) is one. Kept as written, 18 claims took
    the checkpoint past what the daemon reads back (16 MiB): a restarted daemon forgot every
    claim of the node, whoever's, and their Unprepare left their regions as they were."""
    found = parse_config(parameters, where)
    kept: dict[str, object] = {"apiVersion": API_VERSION, "kind": KIND}
    for key, value in found.items():
        if isinstance(value, Qos):
            kept[key] = value.label
        elif key == "burst":
            assert isinstance(value, int)  # hundredths of a percent
            kept[key] = f"{value // HUNDREDTHS_PER_PERCENT}.{value % HUNDREDTHS_PER_PERCENT:02d}"
        else:  # weight (an int), oversubscribe (a bool)
            kept[key] = value
    return kept


def _parse(key: str, value: object) -> object:
    if key == "burst":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError("expected a percent")
        return parse_percent(str(value))
    if key == "qos":
        return parse_qos(value)
    if key == "weight":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WEIGHT:
            raise ValueError(f"expected a whole number from 0 to {MAX_WEIGHT}")
        return value
    if isinstance(value, bool):  # oversubscribe
        return value
    return parse_switch(value)


def merge(configs: list[dict[str, object]]) -> GpuConfig:
    """The parameters in force: each key from the last config that sets it."""
    merged = GpuConfig()
    for found in configs:
        merged = replace(merged, **found)  # type: ignore[arg-type]  # keys checked by parse
    return merged
