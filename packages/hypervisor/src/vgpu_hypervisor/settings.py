"""The daemon's settings: flag > environment > config file > default, each value with its source.

pydantic-settings gives the model (types, ranges, normal forms). The layers are merged here
rather than by pydantic-settings' own sources because the daemon must say where every value came
from (`tf-hypervisor config show`) and turn a bad value into one line naming the flag, variable
or key that holds it; pydantic-settings tracks neither.

Environment names: `TF_HYPERVISOR_<FIELD>` for every field, plus the vgpu.rs names
(`SHM_BASE_PATH`, `API_LISTEN_ADDR`, `GPU_METRICS_FILE`, `TF_LOG_LEVEL`, `TF_LOG_PATH`). When both
are set the `TF_HYPERVISOR_` name wins and `config show` lists the other as overridden: the vgpu.rs
names are shared with the limiter and other tools on the node (`TF_LOG_LEVEL=warn` for the
limiter, `TF_HYPERVISOR_LOG_LEVEL=debug` for the daemon is a sensible pair), so the name that is
the daemon's alone is the more specific intent, not a contradiction. For the same reason a shared
name is checked only when the daemon uses it, while flags, `TF_HYPERVISOR_*` variables and
config-file keys are always checked, even when a higher source overrides them: they exist for the
daemon alone, and a mistake there would otherwise surface the day the override goes away.

An empty variable counts as unset (as the limiter reads them), except for the settings that can
be off (`config_file`, `gpu_metrics_file`, `log_path`), where it turns them off, and
`kubeconfig`, where it means the default search (it too is declared off_when_empty).

Each setting is declared once, as a field of Settings with its `Setting` (flag, shared variables,
help, what None means, how it is shown); FLAGS, ENV_NAMES, the typer options of settings_cli and
`config show`'s text all derive from those declarations.
"""

import difflib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import BeforeValidator, PlainSerializer, PlainValidator, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from vgpu_common.limits import (
    format_percent,
    format_size,
    hundredths_to_percent,
    parse_percent,
    parse_size,
    parse_switch,
)
from vgpu_common.paths import DEFAULT_BASE
from vgpu_common.small_file import SmallFileError, read_small_file

from vgpu_hypervisor.listen_address import (
    LISTEN_FORMS,
    ListenAddress,
    TcpAddress,
    UnixAddress,
    parse_listen_address,
)

DEFAULT_CONFIG_FILE: Final = Path("/etc/tensor-fusion/hypervisor.toml")
ENV_PREFIX: Final = "TF_HYPERVISOR_"
CONFIG_LIMIT: Final = 1 << 20  # bytes of a config file
LogLevel = Literal["error", "warning", "info", "debug"]
LogFormat = Literal["text", "json"]
Placement = Literal["binpack", "spread"]


class SettingsError(ValueError):
    """A bad setting. str() is one line naming the flag, variable or key, and the value."""


# --- value checks (pydantic "before" validators: messages are ours, one line) --------------


def _absolute_path(value: object) -> Path:
    if not isinstance(value, str | os.PathLike) or isinstance(value, bytes):
        raise ValueError("expected a path")
    text = os.fspath(value)
    if not isinstance(text, str) or not text or "\0" in text:
        raise ValueError("expected a path")
    if not text.startswith("/"):
        raise ValueError("must be an absolute path")
    return Path(text)


def _optional_path(value: object) -> Path | None:
    return None if value is None or value == "" else _absolute_path(value)


def _listen(value: object) -> ListenAddress:
    if isinstance(value, TcpAddress | UnixAddress):
        return value
    if not isinstance(value, str):
        raise ValueError(LISTEN_FORMS)
    return parse_listen_address(value)


_DECIMAL = re.compile(r"\s*(\d+(\.\d*)?|\.\d+)\s*", re.ASCII)


def _seconds_between(low: float, high: float) -> Callable[[object], float]:
    """A validator of seconds from ``low`` to ``high``."""
    forms = f"expected seconds between {low:g} and {high:g}"

    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(forms)
        if isinstance(value, str) and not _DECIMAL.fullmatch(value):
            raise ValueError(forms)  # float() also reads "1_0" and other scripts' digits
        try:
            seconds = float(value)
        except (ValueError, OverflowError):  # OverflowError: an integer past any float
            raise ValueError(forms) from None
        if not math.isfinite(seconds) or not low <= seconds <= high:
            raise ValueError(forms)
        return seconds

    return check


_interval = _seconds_between(0.05, 60)
_backoff = _seconds_between(0.1, 600)


def _log_level(value: object) -> str:
    level = value.strip().lower() if isinstance(value, str) else None
    level = "warning" if level == "warn" else level
    if level not in ("error", "warning", "info", "debug"):
        raise ValueError("expected error, warning (or warn), info or debug")
    return level


def _log_format(value: object) -> str:
    kind = value.strip().lower() if isinstance(value, str) else ""
    if kind not in get_args(LogFormat):
        raise ValueError("expected text or json")
    return kind


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def _simulate(value: object) -> bool | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        return parse_switch(value)
    except ValueError:
        raise ValueError("expected true, false or auto") from None


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# An extended resource name: a DNS subdomain prefix outside kubernetes.io, "/", a name. The
# settings are its one check: the device plugin and the pod source take the names from them.
_RESOURCE_NAME = re.compile(
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def _node_name(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError("expected a Kubernetes node name (lower-case DNS subdomain)")
    return value


def _kubernetes(value: object) -> bool | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        return parse_switch(value)
    except ValueError:
        raise ValueError("expected true, false or auto") from None


def _resource_name(value: object) -> str:
    if not isinstance(value, str) or not _RESOURCE_NAME.fullmatch(value):
        raise ValueError("expected an extended resource name DOMAIN/NAME, e.g. vgpu.io/gpu")
    domain = value.split("/", 1)[0]
    # The reserved domains and their subdomains only: a bare endswith("k8s.io") also refused
    # names of other domains that merely end so (notk8s.io/gpu).
    if domain in ("kubernetes.io", "k8s.io") or domain.endswith((".kubernetes.io", ".k8s.io")):
        raise ValueError("the kubernetes.io and k8s.io domains are reserved")
    return value


_WHOLE_NUMBER = re.compile(r"\s*[0-9]+\s*", re.ASCII)


def _shares(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("expected a whole number from 1 to 1000")
    if isinstance(value, str) and not _WHOLE_NUMBER.fullmatch(value):
        # int() also reads "1_0", "+5" and other scripts' digits (U+0665): taken silently before.
        raise ValueError("expected a whole number from 1 to 1000")
    shares = int(value)
    if not 1 <= shares <= 1000:
        raise ValueError("expected a whole number from 1 to 1000")
    return shares


def _context_charge(value: object) -> int:
    """A size up to 64 GiB: more than any GPU's context, which a typo would charge every pod."""
    charge = parse_size(value)
    if charge > 64 << 30:
        raise ValueError(f"{format_size(charge)} is more than any context takes (at most 64GiB)")
    return charge


def _memory_unit(value: object) -> int:
    size = parse_size(value)
    if size < 1 << 20:
        raise ValueError("must be at least 1MiB")
    return size


def _placement(value: object) -> str:
    kind = value.strip().lower() if isinstance(value, str) else None
    if kind not in get_args(Placement):
        raise ValueError("expected binpack or spread")
    return str(kind)


_WHOLE = "whole"  # a default limit that is the whole GPU


def _whole(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() == _WHOLE)


def _default_memory(value: object) -> int | None:
    if _whole(value):
        return None
    try:
        return parse_size(value)
    except ValueError:
        raise ValueError(f"expected {_WHOLE} or a size such as 8GiB") from None


def _default_compute(value: object) -> float | None:
    """In percent (as the API's limits), so that the value checked again reads the same."""
    if _whole(value):
        return None
    try:
        return hundredths_to_percent(parse_percent(value))
    except ValueError:
        raise ValueError(f"expected {_WHOLE} or a percent from 0.01 to 100") from None


def _percent_text(percent: float) -> str:
    return format_percent(percent, "%")


def _url(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        raise ValueError("expected an http:// or https:// URL")
    return value


def _names(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError("expected comma-separated user or group names")
    names = tuple(item.strip() for item in items if item.strip())
    if not names:
        raise ValueError("expected at least one user or group name")
    return names


# What `api_open_reads` may open to callers without the API token (daemon/api/auth.py):
# "node" is /api/v1/status and /api/v1/gpus, "pods" /api/v1/pods, "workers" /api/v1/workers
# (command lines left out), "metrics" /metrics.
API_READ_AREAS: Final = ("node", "pods", "workers", "metrics")


def _read_areas(value: object) -> tuple[str, ...]:
    forms = f"expected none, all, or a comma-separated list of {', '.join(API_READ_AREAS)}"
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError(forms)
    names = {item.strip().lower() for item in items if item.strip()}
    if names <= {"none"}:
        return ()
    if names == {"all"}:
        return API_READ_AREAS
    unknown = sorted(names.difference(API_READ_AREAS))
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a read area; {forms}")
    return tuple(area for area in API_READ_AREAS if area in names)


def _areas_text(value: tuple[str, ...]) -> str:
    return ",".join(value) or "none"


AbsolutePath = Annotated[Path, BeforeValidator(_absolute_path)]
OptionalPath = Annotated[Path | None, BeforeValidator(_optional_path)]
ListenField = Annotated[
    TcpAddress | UnixAddress, PlainValidator(_listen), PlainSerializer(str, return_type=str)
]


# --- one declaration per setting ---------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """How people give and read one setting; attached to its field of Settings, from which
    the flags, the environment names, the `config show` text and the checks derive.

    ``flag``: the option (a switch gets ``--no-`` too when ``metavar`` is None); ``env``:
    its vgpu.rs (shared) variables after TF_HYPERVISOR_<FIELD>; ``none_text``: what None means;
    ``off_when_empty``: an empty value turns it off (otherwise it counts as unset); ``show``:
    how `config show` prints a value."""

    flag: str
    metavar: str | None
    help: str
    env: tuple[str, ...] = ()
    none_text: str = "none"
    off_when_empty: bool = False
    show: Callable[[Any], str] = str


def _seconds(value: float) -> str:
    return f"{value:g} s"


class Settings(BaseSettings):
    """The daemon's effective settings. Build it with `load_settings` / `resolve_settings`:
    constructed directly it reads no environment and no file, only its arguments."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", validate_default=True)

    config_file: Annotated[
        OptionalPath,
        Setting(
            "--config",
            "FILE",
            f"Config file (TOML); '' reads none. Default: {DEFAULT_CONFIG_FILE} if it exists.",
            env=("TF_HYPERVISOR_CONFIG",),
            off_when_empty=True,
        ),
    ] = None
    shm_base_path: Annotated[
        AbsolutePath,
        Setting("--shm-base-path", "PATH", "Base folder of the pods' regions.", ("SHM_BASE_PATH",)),
    ] = DEFAULT_BASE
    api_listen_addr: Annotated[
        ListenField,
        Setting(
            "--listen",
            "ADDR",
            "API address: HOST:PORT, [IPV6]:PORT or unix:/PATH.",
            ("API_LISTEN_ADDR",),
        ),
    ] = TcpAddress("127.0.0.1", 8080)
    token_file: Annotated[
        AbsolutePath,
        Setting("--token-file", "FILE", "File of the API's bearer token (mode 0600)."),
    ] = Path("/var/lib/tensor-fusion/hypervisor.token")
    api_open_reads: Annotated[
        tuple[str, ...],
        BeforeValidator(_read_areas),
        Setting(
            "--api-open-reads",
            "AREAS",
            "API reads answered without the token: none, all, or some of node,pods,workers,"
            "metrics (worker command lines never). Default: none.",
            show=_areas_text,
        ),
    ] = ()
    gpu_metrics_file: Annotated[
        OptionalPath,
        Setting(
            "--metrics-file",
            "FILE",
            "Influx line-protocol metrics file; '' turns it off.",
            ("GPU_METRICS_FILE",),
            none_text="off",
            off_when_empty=True,
        ),
    ] = None
    context_charge: Annotated[
        int,
        BeforeValidator(_context_charge),
        Setting(
            "--context-charge",
            "SIZE",
            "Device memory each CUDA context of a pod is charged (544MiB); a pod's "
            "TF_CUDA_CONTEXT_OVERHEAD may raise it, never lower it.",
            show=format_size,
        ),
    ] = 544 << 20
    metrics_rotate_bytes: Annotated[
        int,
        BeforeValidator(parse_size),
        Setting(
            "--metrics-rotate-bytes",
            "SIZE",
            "Rotate the metrics file at this size (64MiB).",
            show=format_size,
        ),
    ] = 64 << 20
    sample_interval_s: Annotated[
        float,
        BeforeValidator(_interval),
        Setting("--sample-interval", "SECONDS", "GPU sampling period, 0.05 to 60.", show=_seconds),
    ] = 1.0
    log_level: Annotated[
        LogLevel,
        BeforeValidator(_log_level),
        Setting("--log-level", "LEVEL", "error, warning, info or debug.", ("TF_LOG_LEVEL",)),
    ] = "info"
    log_format: Annotated[
        LogFormat,
        BeforeValidator(_log_format),
        Setting("--log-format", "FORMAT", "text (ISO 8601 UTC times) or json (one object a line)."),
    ] = "text"
    log_path: Annotated[
        OptionalPath,
        Setting(
            "--log-path",
            "FILE",
            "Append the log to FILE; '' means stderr.",
            ("TF_LOG_PATH",),
            none_text="stderr",
            off_when_empty=True,
        ),
    ] = None
    simulate: Annotated[
        bool | None,
        BeforeValidator(_simulate),
        Setting(
            "--simulate",
            None,
            "Force the simulated GPU, or forbid it. Default: simulated when no driver is found.",
            none_text="auto-detect",
            show=_yes_no,
        ),
    ] = None
    sim_state: Annotated[
        OptionalPath,
        Setting(
            "--sim-state",
            "FILE",
            "The simulated GPU's node state file (VGPU_SIM_STATE).",
            ("VGPU_SIM_STATE",),
            none_text="the simulator's default",
        ),
    ] = None
    boost_correction: Annotated[
        bool,
        BeforeValidator(parse_switch),
        Setting(
            "--boost-correction",
            None,
            "Charge limited pods for the clock boost a partly idle GPU gives. Default: on.",
            show=_yes_no,
        ),
    ] = True
    kubernetes: Annotated[
        bool | None,
        BeforeValidator(_kubernetes),
        Setting(
            "--kubernetes",
            None,
            "Keep the regions of this node's Kubernetes pods. Default: on in a cluster "
            "(KUBERNETES_SERVICE_HOST set).",
            none_text="auto (on when KUBERNETES_SERVICE_HOST is set)",
            show=_yes_no,
        ),
    ] = None
    node_name: Annotated[
        str | None,
        BeforeValidator(_node_name),
        Setting(
            "--node-name",
            "NAME",
            "This node's Kubernetes name (the DaemonSet sets NODE_NAME from spec.nodeName).",
            ("NODE_NAME",),
            none_text="unset",
        ),
    ] = None
    kubeconfig: Annotated[
        OptionalPath,
        Setting(
            "--kubeconfig",
            "FILE",
            "Kubeconfig of the API server; FILE:FILE… are merged as kubectl merges them. "
            "Default: the pod's service account in a cluster.",
            ("KUBECONFIG",),
            none_text="in-cluster service account, else ~/.kube/config",
            off_when_empty=True,
        ),
    ] = None
    kube_backoff_max_s: Annotated[
        float,
        BeforeValidator(_backoff),
        Setting(
            "--kube-backoff-max",
            "SECONDS",
            "Longest pause between attempts to reach the API server, 0.1 to 600.",
            show=_seconds,
        ),
    ] = 30.0
    device_plugin: Annotated[
        bool,
        BeforeValidator(parse_switch),
        Setting(
            "--device-plugin",
            None,
            "Serve the kubelet device plugin (vgpu.io resources). Default: off.",
            show=_yes_no,
        ),
    ] = False
    device_plugin_dir: Annotated[
        AbsolutePath,
        Setting("--device-plugin-dir", "PATH", "The kubelet's device-plugin socket folder."),
    ] = Path("/var/lib/kubelet/device-plugins")
    device_plugin_lib_dir: Annotated[
        AbsolutePath,
        Setting(
            "--device-plugin-lib-dir",
            "PATH",
            "Host folder with libadd_path.so and libcuda_limiter.so, mounted into containers.",
        ),
    ] = Path("/usr/local/vgpu/lib")
    pod_resources_socket: Annotated[
        AbsolutePath,
        Setting(
            "--pod-resources-socket",
            "PATH",
            "The kubelet's PodResources socket: which pod holds the devices Allocate gave.",
        ),
    ] = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    dra: Annotated[
        bool,
        BeforeValidator(parse_switch),
        Setting(
            "--dra",
            None,
            "Serve the kubelet DRA driver gpu.vgpu.io and publish the node's ResourceSlice. "
            "Default: off.",
            show=_yes_no,
        ),
    ] = False
    dra_plugins_dir: Annotated[
        AbsolutePath,
        Setting("--dra-plugins-dir", "PATH", "The kubelet's plugin folder (the DRA socket)."),
    ] = Path("/var/lib/kubelet/plugins")
    dra_registry_dir: Annotated[
        AbsolutePath,
        Setting("--dra-registry-dir", "PATH", "The kubelet's plugin registration folder."),
    ] = Path("/var/lib/kubelet/plugins_registry")
    cdi_dir: Annotated[
        AbsolutePath,
        Setting("--cdi-dir", "PATH", "Where the DRA driver writes the claims' CDI specs."),
    ] = Path("/var/run/cdi")
    gpu_resource: Annotated[
        str,
        BeforeValidator(_resource_name),
        Setting("--gpu-resource", "NAME", "Extended resource of GPU shares."),
    ] = "vgpu.io/gpu"
    gpu_memory_resource: Annotated[
        str,
        BeforeValidator(_resource_name),
        Setting("--gpu-memory-resource", "NAME", "Extended resource of GPU memory units."),
    ] = "vgpu.io/gpu-memory"
    gpu_compute_resource: Annotated[
        str,
        BeforeValidator(_resource_name),
        Setting("--gpu-compute-resource", "NAME", "Extended resource of GPU percent."),
    ] = "vgpu.io/gpu-compute"
    gpu_shares: Annotated[
        int,
        BeforeValidator(_shares),
        Setting("--gpu-shares", "N", "Containers that may share one GPU, 1 to 1000."),
    ] = 10
    gpu_memory_unit: Annotated[
        int,
        BeforeValidator(_memory_unit),
        Setting(
            "--gpu-memory-unit",
            "SIZE",
            "GPU memory of one gpu-memory resource unit (1GiB; at least 1MiB).",
            show=format_size,
        ),
    ] = 1 << 30
    gpu_placement: Annotated[
        Placement,
        BeforeValidator(_placement),
        Setting(
            "--gpu-placement",
            "POLICY",
            "Where the device plugin prefers a pod's GPU shares: binpack (the fullest GPU that "
            "holds the pod) or spread (the emptiest).",
        ),
    ] = "binpack"
    default_gpu_memory: Annotated[
        int | None,
        BeforeValidator(_default_memory),
        Setting(
            "--default-gpu-memory",
            "SIZE",
            "Memory limit of a pod that asks for the GPU resource but no memory: whole, or a "
            "size (at most the GPU's).",
            none_text=_WHOLE,
            show=format_size,
        ),
    ] = None
    default_gpu_compute: Annotated[
        float | None,
        BeforeValidator(_default_compute),
        Setting(
            "--default-gpu-compute",
            "PERCENT",
            "Compute limit of a pod that asks for the GPU resource but no compute: whole, or "
            "a percent.",
            none_text=_WHOLE,
            show=_percent_text,
        ),
    ] = None
    tenant_raise: Annotated[
        bool,
        BeforeValidator(parse_switch),
        Setting(
            "--tenant-raise",
            None,
            "Let a pod limited by annotations alone raise its limits by editing them after "
            "it started. Default: off (raises are the admin's, through the API).",
            show=_yes_no,
        ),
    ] = False
    token_review: Annotated[
        bool,
        BeforeValidator(parse_switch),
        Setting(
            "--token-review",
            None,
            "Accept Kubernetes tokens for the API through TokenReview. Default: off.",
            show=_yes_no,
        ),
    ] = False
    token_review_url: Annotated[
        str | None,
        BeforeValidator(_url),
        Setting(
            "--token-review-url",
            "URL",
            "TokenReview endpoint. Default: the in-cluster API server.",
            none_text="in-cluster",
        ),
    ] = None
    token_review_allow: Annotated[
        tuple[str, ...],
        BeforeValidator(_names),
        Setting(
            "--token-review-allow",
            "NAMES",
            "Comma-separated users or groups whose tokens may use the API.",
            show=",".join,
        ),
    ] = ("system:masters",)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment and file are layered by resolve_settings, which knows each value's source.
        return (init_settings,)


def _declaration(name: str) -> Setting:
    field = Settings.model_fields[name]
    return next(item for item in field.metadata if isinstance(item, Setting))


def _is_path(name: str) -> bool:
    annotation = Settings.model_fields[name].annotation
    return annotation is Path or Path in get_args(annotation)


FIELDS: Final = tuple(Settings.model_fields)
SETTINGS: Final[Mapping[str, Setting]] = MappingProxyType(
    {name: _declaration(name) for name in FIELDS}
)
# The flag of each field. The daemon and `config show` take the same flags; typer parameters
# named as the fields let a command pass its flags straight to load_settings.
FLAGS: Final[Mapping[str, str]] = MappingProxyType(
    {name: setting.flag for name, setting in SETTINGS.items()}
)
# Environment names of each field, the winner first.
ENV_NAMES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {name: (ENV_PREFIX + name.upper(), *setting.env) for name, setting in SETTINGS.items()}
)
_PATHS: Final = frozenset(name for name in FIELDS if _is_path(name))


def format_value(name: str, value: object) -> str:
    """A setting's value as `config show` prints it."""
    setting = SETTINGS[name]
    return setting.none_text if value is None else setting.show(value)


# --- layers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Given:
    """One value from one source: `source` for `config show`, `where` to start an error."""

    value: object
    source: str
    where: str
    checked: bool = True  # False: a shared variable, checked only if it takes effect


def _show(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if len(text) > 80:
        text = text[:77] + "..."
    plain = text and text.isprintable() and not any(char.isspace() for char in text)
    return text if plain else json.dumps(text)


def _show_toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{...}"
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# Spellings a typo may be close to (field and flag names), to the field they mean.
_HINTS: Final = {
    **{name: name for name in FIELDS},
    **{flag.removeprefix("--"): name for name, flag in FLAGS.items()},
}


def _suggest(key: str, names: Mapping[str, str]) -> str:
    """ " (did you mean X?)" for the name closest to `key`; `names` maps spellings to X."""
    spellings = {spelling.lower().replace("-", "_"): name for spelling, name in names.items()}
    close = difflib.get_close_matches(key.lower().replace("-", "_"), list(spellings), n=1)
    return f" (did you mean {spellings[close[0]]}?)" if close else ""


def _flag_layer(flags: Mapping[str, object]) -> dict[str, _Given]:
    layer: dict[str, _Given] = {}
    for name, raw in flags.items():
        if name not in FLAGS:
            raise KeyError(f"no setting has the flag field {name!r}")
        if raw is None:
            continue
        value = raw
        flag = FLAGS[name]
        if isinstance(value, bool):  # --NAME/--no-NAME
            flag = flag if value else flag.replace("--", "--no-", 1)
            layer[name] = _Given(value, f"flag:{flag}", flag)
            continue
        if name in _PATHS and isinstance(value, str | os.PathLike) and not isinstance(value, bytes):
            # A relative path on a command line means what the shell user sees: from here.
            text = os.fspath(value)
            if isinstance(text, str) and text and not text.startswith("/"):
                value = str(Path.cwd() / text)
        layer[name] = _Given(value, f"flag:{flag}", f"{flag}={_show(value)}")
    return layer


def _env_layer(
    environ: Mapping[str, str], flags: Mapping[str, _Given]
) -> tuple[dict[str, _Given], dict[str, list[str]], list[str]]:
    layer: dict[str, _Given] = {}
    shadowed: dict[str, list[str]] = {}
    for name in FIELDS:
        for variable in ENV_NAMES[name]:
            value = environ.get(variable)
            if value is None or (value == "" and not SETTINGS[name].off_when_empty):
                continue
            if name in layer:
                shadowed.setdefault(name, []).append(f"env:{variable}")
                continue
            owned = variable.startswith(ENV_PREFIX)
            checked = owned or name not in flags
            layer[name] = _Given(value, f"env:{variable}", f"{variable}={_show(value)}", checked)
    known = {variable for names in ENV_NAMES.values() for variable in names}
    hints = {spelling: ENV_PREFIX + name.upper() for spelling, name in _HINTS.items()}
    warnings = [
        f"{variable} is not a tf-hypervisor setting; ignored"
        + _suggest(variable.removeprefix(ENV_PREFIX), hints)
        for variable in sorted(environ)
        if variable.startswith(ENV_PREFIX) and variable not in known
    ]
    return layer, shadowed, warnings


def _read_config(path: Path, where: str, required: bool) -> dict[str, Any] | None:
    try:
        data = read_small_file(path, CONFIG_LIMIT)
    except SmallFileError as error:
        raise SettingsError(f"{where}: {error}") from None
    except (FileNotFoundError, NotADirectoryError):
        if not required:
            return None
        raise SettingsError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise SettingsError(f"{where}: is a folder, not a file") from None
    except OSError as error:
        raise SettingsError(f"{where}: cannot read: {error.strerror or error}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise SettingsError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except tomllib.TOMLDecodeError as error:
        message = " ".join(str(error).split())
        raise SettingsError(f"{path}: invalid TOML: {message}") from None


def _file_layer(path: Path, document: Mapping[str, Any]) -> dict[str, _Given]:
    keys = {name for name in FIELDS if name != "config_file"}
    hints = {spelling: name for spelling, name in _HINTS.items() if name in keys}
    layer: dict[str, _Given] = {}
    for key, value in document.items():
        if key == "config_file":
            raise SettingsError(f"{path}: config_file cannot be set in a config file")
        if key not in keys:
            raise SettingsError(f"{path}: unknown key {key!r}{_suggest(key, hints)}")
        layer[key] = _Given(value, f"file:{path}", f"{path}: {key} = {_show_toml(value)}")
    return layer


def _check(layer: Mapping[str, _Given]) -> dict[str, object]:
    """The layer's checked values, validated; the first bad one as a SettingsError."""
    values = {name: given.value for name, given in layer.items() if given.checked}
    try:
        model = Settings.model_validate(values)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        message = " ".join(str(first["msg"]).removeprefix("Value error, ").split())
        where = layer[name].where if name in layer else name
        raise SettingsError(f"{where}: {message}") from None
    return {name: getattr(model, name) for name in values}


# --- the result --------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedSettings:
    """Settings with, per field, the source of its value ("flag:--listen", "env:NAME",
    "file:/path" or "default") and the lower sources it overrides."""

    settings: Settings
    sources: Mapping[str, str]
    overridden: Mapping[str, tuple[str, ...]]
    warnings: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """The document `config show --json` prints."""
        values = self.settings.model_dump(mode="json")
        return {
            "settings": {
                name: {
                    "value": values[name],
                    "source": self.sources[name],
                    "overridden": list(self.overridden.get(name, ())),
                    "flag": FLAGS[name],
                    "env": list(ENV_NAMES[name]),
                }
                for name in FIELDS
            },
            "warnings": list(self.warnings),
        }


def resolve_settings(
    flags: Mapping[str, object] = MappingProxyType({}),
    environ: Mapping[str, str] | None = None,
    *,
    default_config_file: Path = DEFAULT_CONFIG_FILE,
) -> ResolvedSettings:
    """Merge flags (keyed by field name; None = not given), the environment (default
    os.environ) and the config file over the defaults. Raises SettingsError."""
    environment = os.environ if environ is None else environ
    flag_layer = _flag_layer(flags)
    env_layer, shadowed, warnings = _env_layer(environment, flag_layer)
    checked_flags = _check(flag_layer)
    checked_env = _check(env_layer)

    file_layer: dict[str, _Given] = {}
    config_given = flag_layer.get("config_file") or env_layer.get("config_file")
    if config_given is not None:
        chosen = checked_flags.get("config_file", checked_env.get("config_file"))
        config_file = chosen if isinstance(chosen, Path) else None
        where = config_given.where
    else:
        config_file, where = default_config_file, str(default_config_file)
    if config_file is not None:
        document = _read_config(config_file, where, required=config_given is not None)
        if document is None:
            config_file = None  # the default location, absent
        else:
            file_layer = _file_layer(config_file, document)
    checked_file = _check(file_layer)

    values: dict[str, object] = {"config_file": config_file}
    sources = {name: "default" for name in FIELDS}
    overridden: dict[str, tuple[str, ...]] = {}
    layers = ((flag_layer, checked_flags), (env_layer, checked_env), (file_layer, checked_file))
    for name in FIELDS:
        chain = [layer[name].source for layer, _ in layers if name in layer]
        if name in env_layer:  # the shadowed variables come right after the one that won
            position = chain.index(env_layer[name].source) + 1
            chain[position:position] = shadowed.get(name, [])
        if not chain:
            continue
        sources[name] = chain[0]
        if chain[1:]:
            overridden[name] = tuple(chain[1:])
        # The winner was checked: only a shared variable under a flag goes unchecked.
        values[name] = next(checked[name] for layer, checked in layers if name in layer)
    settings = Settings.model_validate(values)
    return ResolvedSettings(settings, MappingProxyType(sources), overridden, tuple(warnings))


def load_settings(
    flags: Mapping[str, object] = MappingProxyType({}),
    environ: Mapping[str, str] | None = None,
    *,
    default_config_file: Path = DEFAULT_CONFIG_FILE,
) -> Settings:
    """The effective settings (see resolve_settings). Raises SettingsError."""
    return resolve_settings(flags, environ, default_config_file=default_config_file).settings
