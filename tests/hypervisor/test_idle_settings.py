"""Settings given that the daemon, as configured, never reads are said at start."""

import logging
import re
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon.idle_settings import idle_settings
from vgpu_hypervisor.settings import resolve_settings

from tests.hypervisor.conftest import Daemon


def _idle(flags: dict[str, object], pod_source: bool = False) -> list[str]:
    resolved = resolve_settings(flags, {}, default_config_file=Path("/nonexistent"))
    return idle_settings(resolved.settings, resolved.sources, pod_source)


def test_a_setting_of_a_part_that_does_not_run_is_said() -> None:
    assert _idle({"gpu_shares": 5, "token_review_allow": ["bob"]}) == [
        "gpu_shares (flag:--gpu-shares) takes effect only with --device-plugin: ignored",
        "token_review_allow (flag:--token-review-allow) takes effect only with --token-review: "
        "ignored",
    ]
    assert _idle({"metrics_rotate_bytes": "1KiB"}) == [
        "metrics_rotate_bytes (flag:--metrics-rotate-bytes) takes effect only with a metrics "
        "file (--metrics-file): ignored"
    ]


def test_settings_the_running_parts_read_and_defaults_are_not_said(tmp_path: Path) -> None:
    assert _idle({}) == []
    assert _idle({"gpu_shares": 5, "device_plugin": True}) == []
    assert _idle({"tenant_raise": True, "node_name": "n1"}, pod_source=True) == []
    assert _idle({"tenant_raise": True, "device_plugin": True}) == [
        "tenant_raise (flag:--tenant-raise) takes effect only with the pod source "
        "(--kubernetes): ignored"
    ]
    metrics: dict[str, object] = {
        "metrics_rotate_bytes": "1KiB",
        "gpu_metrics_file": str(tmp_path / "m"),
    }
    assert _idle(metrics) == []


def test_the_daemon_says_them_at_start(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, extra=("--gpu-shares", "5", "--token-review-allow", "bob"))
    daemon.start()
    try:
        log = daemon.log_file.read_text()
        assert "gpu_shares (flag:--gpu-shares) takes effect only with --device-plugin" in log
        assert "token_review_allow (flag:--token-review-allow) takes effect only" in log
    finally:
        daemon.close()


def test_the_flags_the_lines_name_are_the_daemons_flags() -> None:
    # A line named --gpu-metrics-file, a flag no command takes.
    from vgpu_hypervisor.daemon.idle_settings import _PARTS
    from vgpu_hypervisor.settings import FLAGS

    flags = set(FLAGS.values())
    for parts, _ in _PARTS.values():
        for named in re.findall(r"--[a-z-]+", parts):
            assert named in flags, parts


@pytest.mark.parametrize(("backend", "said"), [("nvml", True), ("simulated", False)])
def test_a_sim_state_on_the_nvidia_driver_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, backend: str, said: bool
) -> None:
    # The driver runs (a node with GPUs, --simulate not given): the state file is never read.
    import asyncio
    import types

    from vgpu_hypervisor.daemon import service
    from vgpu_hypervisor.gpu.observer import GpuObserver
    from vgpu_hypervisor.settings import Settings

    info = types.SimpleNamespace(backend=backend, describe=lambda: "GPU backend: test")

    class Observer:
        backend = info

        def __enter__(self) -> "Observer":
            return self

        def __exit__(self, *_: object) -> None:
            pass

    async def serve(self: object, observer: object) -> None:
        pass

    monkeypatch.setattr(GpuObserver, "open", lambda **_: Observer())
    monkeypatch.setattr(service.Daemon, "_serve", serve)
    settings = Settings(sim_state=Path("/run/sim.state"), kubernetes=False)
    with caplog.at_level(logging.WARNING, logger="vgpu_hypervisor"):
        asyncio.run(service.Daemon(settings).run())
    warning = (
        "sim_state (/run/sim.state) takes effect only with the simulated GPU, and the NVIDIA "
        "driver runs: ignored"
    )
    assert (warning in caplog.messages) is said
