"""Settings given (by a flag, a variable or the config file) that the daemon, as configured,
never reads: each is said at start, with what would make it take effect. A mistyped
deployment (--gpu-shares without --device-plugin, a metrics rotation without a metrics file)
otherwise looks configured and does nothing."""

from collections.abc import Callable, Mapping

from vgpu_hypervisor.settings import Settings

# Each setting that only some part of the daemon reads: the parts (names as the flags say
# them) and whether any of them runs.
_PARTS: dict[str, tuple[str, Callable[[Settings, bool], bool]]] = {}


def _read_by(names: tuple[str, ...], parts: str, runs: Callable[[Settings, bool], bool]) -> None:
    for name in names:
        _PARTS[name] = (parts, runs)


_read_by(
    ("gpu_shares", "gpu_placement", "pod_resources_socket", "device_plugin_dir"),
    "--device-plugin",
    lambda s, _: s.device_plugin,
)
_read_by(
    ("device_plugin_lib_dir",), "--device-plugin or --dra", lambda s, _: s.device_plugin or s.dra
)
_read_by(("dra_plugins_dir", "dra_registry_dir", "cdi_dir"), "--dra", lambda s, _: s.dra)
_read_by(
    (
        "gpu_resource",
        "gpu_memory_resource",
        "gpu_compute_resource",
        "gpu_memory_unit",
        "default_gpu_memory",
        "default_gpu_compute",
    ),
    "the pod source (--kubernetes) or --device-plugin",
    lambda s, pod_source: pod_source or s.device_plugin,
)
_read_by(
    ("tenant_raise", "kube_backoff_max_s"),
    "the pod source (--kubernetes)",
    lambda _, pod_source: pod_source,
)
_read_by(
    ("node_name", "kubeconfig"),
    "the pod source (--kubernetes), --device-plugin or --dra",
    lambda s, pod_source: pod_source or s.device_plugin or s.dra,
)
_read_by(("token_review_url", "token_review_allow"), "--token-review", lambda s, _: s.token_review)
_read_by(
    ("metrics_rotate_bytes",),
    # The flag's real name: this said --gpu-metrics-file, which no command takes.
    "a metrics file (--metrics-file)",
    lambda s, _: s.gpu_metrics_file is not None,
)


def idle_settings(settings: Settings, sources: Mapping[str, str], pod_source: bool) -> list[str]:
    """A line for each setting given (its source is not the default) that nothing reads, as
    ``settings`` configure the daemon; ``pod_source``: whether the Kubernetes pod source
    runs."""
    lines = []
    for name, (parts, runs) in _PARTS.items():
        source = sources.get(name, "default")
        if source != "default" and not runs(settings, pod_source):
            lines.append(f"{name} ({source}) takes effect only with {parts}: ignored")
    return lines
