"""The daemon's settings: precedence, the vgpu.rs names, one-line errors naming their source,
the config file, and `tf-hypervisor config show`."""

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner, Result
from vgpu_common.limits import parse_size
from vgpu_hypervisor.listen_address import TcpAddress, UnixAddress, parse_listen_address
from vgpu_hypervisor.settings import (
    ENV_NAMES,
    FIELDS,
    FLAGS,
    SETTINGS,
    ResolvedSettings,
    Settings,
    SettingsError,
    load_settings,
    resolve_settings,
)
from vgpu_hypervisor.settings_cli import app as config_app

MiB = 1 << 20


@pytest.fixture
def no_default_file(tmp_path: Path) -> Path:
    return tmp_path / "absent" / "hypervisor.toml"


def resolve(
    flags: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    default_config_file: Path | None = None,
) -> ResolvedSettings:
    """Settings from exactly these flags and variables; no default config file unless given."""
    return resolve_settings(
        flags or {},
        environ or {},
        default_config_file=default_config_file or Path("/nonexistent/hypervisor.toml"),
    )


def error_of(
    flags: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    with pytest.raises(SettingsError) as raised:
        resolve(flags, environ)
    message = str(raised.value)
    assert "\n" not in message
    assert "validation error" not in message.lower()
    return message


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and precedence -----------------------------------------------------------------


def test_defaults() -> None:
    resolved = resolve()
    settings = resolved.settings
    assert settings.config_file is None
    assert settings.shm_base_path == Path("/run/tensor-fusion/shm")
    assert settings.api_listen_addr == TcpAddress("127.0.0.1", 8080)
    assert settings.token_file == Path("/var/lib/tensor-fusion/hypervisor.token")
    assert settings.gpu_metrics_file is None
    assert settings.metrics_rotate_bytes == 64 * MiB
    assert settings.sample_interval_s == 1.0
    assert settings.log_level == "info"
    assert settings.log_path is None
    assert settings.simulate is None
    assert dict(resolved.sources) == dict.fromkeys(FIELDS, "default")
    assert resolved.overridden == {}
    assert resolved.warnings == ()


def test_every_field_has_a_flag_and_its_own_variable() -> None:
    assert set(FLAGS) == set(FIELDS)
    for name in FIELDS:
        assert ENV_NAMES[name][0] == f"TF_HYPERVISOR_{name.upper()}"


def test_every_setting_s_declaration_is_its_flag_and_help_in_config_show() -> None:
    result = CliRunner().invoke(config_app, ["show", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for name, setting in SETTINGS.items():
        flag = setting.flag if setting.metavar else f"{setting.flag} / --no-"
        assert flag in text, name
        assert " ".join(setting.help.split()[:4]) in text, name


def test_settings_built_directly_read_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_HYPERVISOR_LOG_LEVEL", "debug")
    monkeypatch.setenv("TF_LOG_LEVEL", "debug")
    assert Settings().log_level == "info"


# field, flag value, variable, variable value, TOML line, expected value at each level
PRECEDENCE = [
    (
        "api_listen_addr",
        "10.0.0.1:1",
        "TF_HYPERVISOR_API_LISTEN_ADDR",
        "10.0.0.2:2",
        'api_listen_addr = "10.0.0.3:3"',
        (TcpAddress("10.0.0.1", 1), TcpAddress("10.0.0.2", 2), TcpAddress("10.0.0.3", 3)),
    ),
    (
        "shm_base_path",
        "/flag",
        "SHM_BASE_PATH",
        "/env",
        'shm_base_path = "/file"',
        (Path("/flag"), Path("/env"), Path("/file")),
    ),
    (
        "sample_interval_s",
        "0.25",
        "TF_HYPERVISOR_SAMPLE_INTERVAL_S",
        "2",
        "sample_interval_s = 30",
        (0.25, 2.0, 30.0),
    ),
    (
        "log_level",
        "DEBUG",
        "TF_LOG_LEVEL",
        "warn",
        'log_level = "error"',
        ("debug", "warning", "error"),
    ),
    (
        "metrics_rotate_bytes",
        "1MiB",
        "TF_HYPERVISOR_METRICS_ROTATE_BYTES",
        "2097152",
        'metrics_rotate_bytes = "3MiB"',
        (1 * MiB, 2 * MiB, 3 * MiB),
    ),
    ("simulate", True, "TF_HYPERVISOR_SIMULATE", "no", "simulate = true", (True, False, True)),
]


@pytest.mark.parametrize(
    ("name", "flag", "variable", "value", "line", "expected"),
    PRECEDENCE,
    ids=[case[0] for case in PRECEDENCE],
)
def test_flag_over_environment_over_file_over_default(
    *,
    tmp_path: Path,
    name: str,
    flag: object,
    variable: str,
    value: str,
    line: str,
    expected: tuple[object, object, object],
) -> None:
    config = write(tmp_path / "hypervisor.toml", line + "\n")
    by_flag, by_env, by_file = expected
    file_source, env_source, flag_source = f"file:{config}", f"env:{variable}", "flag:"

    with_file = resolve(default_config_file=config)
    assert getattr(with_file.settings, name) == by_file
    assert with_file.sources[name] == file_source
    assert with_file.sources["config_file"] == "default"
    assert with_file.settings.config_file == config

    with_env = resolve(environ={variable: value}, default_config_file=config)
    assert getattr(with_env.settings, name) == by_env
    assert with_env.sources[name] == env_source
    assert with_env.overridden[name] == (file_source,)

    with_flag = resolve({name: flag}, {variable: value}, default_config_file=config)
    assert getattr(with_flag.settings, name) == by_flag
    assert with_flag.sources[name].startswith(flag_source + FLAGS[name].split("/")[0])
    assert with_flag.overridden[name] == (env_source, file_source)


def test_config_file_named_by_flag_or_variable(tmp_path: Path) -> None:
    by_env = write(tmp_path / "env.toml", 'log_level = "debug"\n')
    by_flag = write(tmp_path / "flag.toml", 'log_level = "error"\n')
    resolved = resolve(environ={"TF_HYPERVISOR_CONFIG": str(by_env)})
    assert (resolved.settings.log_level, resolved.sources["log_level"]) == (
        "debug",
        f"file:{by_env}",
    )
    assert resolved.sources["config_file"] == "env:TF_HYPERVISOR_CONFIG"
    resolved = resolve({"config_file": str(by_flag)}, {"TF_HYPERVISOR_CONFIG": str(by_env)})
    assert resolved.settings.log_level == "error"
    assert resolved.settings.config_file == by_flag
    assert resolved.overridden["config_file"] == ("env:TF_HYPERVISOR_CONFIG",)


def test_default_config_file_is_read_only_when_present(tmp_path: Path) -> None:
    default = tmp_path / "hypervisor.toml"
    assert resolve(default_config_file=default).settings.config_file is None
    write(default, 'log_level = "debug"\n')
    assert resolve(default_config_file=default).settings.log_level == "debug"
    # An empty --config or TF_HYPERVISOR_CONFIG reads no file, not even the default one.
    for flags, environ in (({"config_file": ""}, {}), ({}, {"TF_HYPERVISOR_CONFIG": ""})):
        resolved = resolve(flags, environ, default_config_file=default)
        assert resolved.settings.log_level == "info"
        assert resolved.settings.config_file is None


def test_relative_flag_paths_are_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "local.toml", "sample_interval_s = 5\n")
    settings = load_settings(
        {"config_file": "local.toml", "gpu_metrics_file": "m.log", "token_file": "t/token"},
        {},
    )
    assert settings.config_file == tmp_path / "local.toml"
    assert settings.sample_interval_s == 5.0
    assert settings.gpu_metrics_file == tmp_path / "m.log"
    assert settings.token_file == tmp_path / "t" / "token"


def test_unknown_flag_field_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        resolve({"listen": "127.0.0.1:1"})


# --- the vgpu.rs names ------------------------------------------------------------------------

SHARED = [
    ("SHM_BASE_PATH", "/srv/shm", "shm_base_path", Path("/srv/shm")),
    ("API_LISTEN_ADDR", "0.0.0.0:8000", "api_listen_addr", TcpAddress("0.0.0.0", 8000)),
    ("GPU_METRICS_FILE", "/logs/metrics.log", "gpu_metrics_file", Path("/logs/metrics.log")),
    ("TF_LOG_LEVEL", "Debug", "log_level", "debug"),
    ("TF_LOG_PATH", "/var/log/tf.log", "log_path", Path("/var/log/tf.log")),
]


@pytest.mark.parametrize(("variable", "value", "name", "expected"), SHARED)
def test_vgpu_rs_names(variable: str, value: str, name: str, expected: object) -> None:
    resolved = resolve(environ={variable: value})
    assert getattr(resolved.settings, name) == expected
    assert resolved.sources[name] == f"env:{variable}"


@pytest.mark.parametrize(("variable", "value", "name", "expected"), SHARED)
def test_tf_hypervisor_name_wins_over_the_vgpu_rs_name(
    variable: str, value: str, name: str, expected: object
) -> None:
    own = f"TF_HYPERVISOR_{name.upper()}"
    resolved = resolve(environ={variable: value, own: Settings().model_dump()[name] or ""})
    assert resolved.sources[name] == f"env:{own}"
    assert resolved.overridden[name] == (f"env:{variable}",)
    assert getattr(resolved.settings, name) == getattr(Settings(), name)


def test_a_shared_name_is_checked_only_when_used() -> None:
    # TF_LOG_LEVEL may be meant for another tool; the daemon's own name overrides it unchecked.
    assert resolve(environ={"TF_LOG_LEVEL": "trace", "TF_HYPERVISOR_LOG_LEVEL": "info"})
    assert resolve({"log_level": "info"}, {"TF_LOG_LEVEL": "trace"})
    assert error_of(environ={"TF_LOG_LEVEL": "trace"}).startswith("TF_LOG_LEVEL=trace: ")


def test_the_daemons_own_names_are_checked_even_when_overridden(tmp_path: Path) -> None:
    message = error_of({"log_level": "info"}, {"TF_HYPERVISOR_LOG_LEVEL": "trace"})
    assert message.startswith("TF_HYPERVISOR_LOG_LEVEL=trace: ")
    config = write(tmp_path / "c.toml", 'log_level = "trace"\n')
    message = error_of({"log_level": "info", "config_file": str(config)})
    assert (
        message
        == f'{config}: log_level = "trace": expected error, warning (or warn), info or debug'
    )


def test_empty_variables() -> None:
    # Unset for settings that cannot be off, as the limiter reads them ...
    environ = {"SHM_BASE_PATH": "", "TF_LOG_LEVEL": "", "TF_HYPERVISOR_SIMULATE": ""}
    resolved = resolve(environ=environ)
    assert resolved.sources["shm_base_path"] == "default"
    assert resolved.sources["log_level"] == "default"
    # ... and "off" for those that can, overriding the config file.
    resolved = resolve(environ={"GPU_METRICS_FILE": "", "TF_HYPERVISOR_LOG_PATH": ""})
    assert resolved.sources["gpu_metrics_file"] == "env:GPU_METRICS_FILE"
    assert resolved.settings.gpu_metrics_file is None
    assert resolved.settings.log_path is None


def test_config_file_empty_value_turns_metrics_off(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", 'gpu_metrics_file = "/m.log"\nlog_path = "/l.log"\n')
    resolved = resolve({"gpu_metrics_file": ""}, {"TF_HYPERVISOR_CONFIG": str(config)})
    assert resolved.settings.gpu_metrics_file is None
    assert resolved.sources["gpu_metrics_file"] == "flag:--metrics-file"
    assert resolved.settings.log_path == Path("/l.log")


def test_unknown_tf_hypervisor_variables_are_warnings() -> None:
    resolved = resolve(environ={"TF_HYPERVISOR_LISTEN": "x", "TF_HYPERVISOR_ZZZ": "1"})
    assert resolved.warnings == (
        "TF_HYPERVISOR_LISTEN is not a tf-hypervisor setting; ignored "
        "(did you mean TF_HYPERVISOR_API_LISTEN_ADDR?)",
        "TF_HYPERVISOR_ZZZ is not a tf-hypervisor setting; ignored",
    )


# --- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("warn", "warning"),
        ("WARNING", "warning"),
        (" Info ", "info"),
        ("ERROR", "error"),
        ("debug", "debug"),
    ],
)
def test_log_levels(text: str, expected: str) -> None:
    assert load_settings({"log_level": text}, {}).log_level == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("YES", True), ("on", True), ("false", False), ("0", False), ("auto", None)],
)
def test_simulate_values(text: str, expected: bool | None) -> None:
    assert load_settings({}, {"TF_HYPERVISOR_SIMULATE": text}).simulate is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("64MiB", 64 * MiB),
        ("64 mib", 64 * MiB),
        ("1.5GiB", 3 << 29),
        ("512k", 512 << 10),
        ("2g", 2 << 30),
        ("10MB", 10**7),
    ],
)
def test_sizes(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", [0, -1, "0", "1.5", "0.1k", "-5", "x", "5 XB", True, 1.0, ""])
def test_bad_sizes(value: object) -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        parse_size(value)


BAD_FLAGS = [
    ("api_listen_addr", "localhost:99999", "--listen=localhost:99999: port 99999 is out of range"),
    ("api_listen_addr", "localhost:0", "--listen=localhost:0: port 0 is out of range 1-65535"),
    ("api_listen_addr", "unix:run/h.sock", "--listen=unix:run/h.sock: the unix socket path must"),
    ("api_listen_addr", "::1:80", "--listen=::1:80: an IPv6 address needs brackets"),
    ("api_listen_addr", "", '--listen="": expected HOST:PORT, [IPV6]:PORT or unix:'),
    ("log_level", "loud", "--log-level=loud: expected error, warning (or warn), info or debug"),
    ("sample_interval_s", "-1", "--sample-interval=-1: expected seconds between 0.05 and 60"),
    ("sample_interval_s", "0.01", "--sample-interval=0.01: expected seconds between 0.05"),
    ("sample_interval_s", "nan", "--sample-interval=nan: expected seconds between 0.05"),
    ("sample_interval_s", "soon", "--sample-interval=soon: expected seconds between 0.05"),
    ("metrics_rotate_bytes", "0", "--metrics-rotate-bytes=0: expected a number of bytes"),
    ("shm_base_path", "", '--shm-base-path="": expected a path'),
    ("api_open_reads", "pods,secrets", "--api-open-reads=pods,secrets: 'secrets' is not a read"),
    ("gpu_resource", "gpu", "--gpu-resource=gpu: expected an extended resource name DOMAIN/NAME"),
    ("gpu_memory_resource", "k8s.io/mem", "--gpu-memory-resource=k8s.io/mem: the kubernetes.io"),
    ("gpu_placement", "pack", "--gpu-placement=pack: expected binpack or spread"),
    ("default_gpu_memory", "lots", "--default-gpu-memory=lots: expected whole or a size such"),
    ("default_gpu_compute", "250", "--default-gpu-compute=250: expected whole or a percent"),
]


@pytest.mark.parametrize(("name", "value", "start"), BAD_FLAGS)
def test_bad_flag_values(name: str, value: str, start: str) -> None:
    assert error_of({name: value}).startswith(start)


BAD_VARIABLES = [
    (
        "API_LISTEN_ADDR",
        "0.0.0.0:http",
        "API_LISTEN_ADDR=0.0.0.0:http: port 'http' is not a number",
    ),
    ("TF_HYPERVISOR_API_LISTEN_ADDR", ":8080", "TF_HYPERVISOR_API_LISTEN_ADDR=:8080: the host is"),
    ("API_LISTEN_ADDR", "unix:sock", "API_LISTEN_ADDR=unix:sock: the unix socket path must be"),
    ("API_LISTEN_ADDR", "300.1.1.1:80", "API_LISTEN_ADDR=300.1.1.1:80: '300.1.1.1' is not an IPv4"),
    ("SHM_BASE_PATH", "run/shm", "SHM_BASE_PATH=run/shm: must be an absolute path"),
    ("TF_LOG_PATH", "tf.log", "TF_LOG_PATH=tf.log: must be an absolute path"),
    ("TF_LOG_LEVEL", "verbose", "TF_LOG_LEVEL=verbose: expected error, warning"),
    ("TF_HYPERVISOR_SAMPLE_INTERVAL_S", "-0.5", "TF_HYPERVISOR_SAMPLE_INTERVAL_S=-0.5: expected"),
    ("TF_HYPERVISOR_SAMPLE_INTERVAL_S", "61", "TF_HYPERVISOR_SAMPLE_INTERVAL_S=61: expected"),
    ("TF_HYPERVISOR_METRICS_ROTATE_BYTES", "-1", "TF_HYPERVISOR_METRICS_ROTATE_BYTES=-1: expected"),
    ("TF_HYPERVISOR_SIMULATE", "maybe", "TF_HYPERVISOR_SIMULATE=maybe: expected true, false or"),
    ("TF_HYPERVISOR_TOKEN_FILE", "a b", 'TF_HYPERVISOR_TOKEN_FILE="a b": must be an absolute'),
    ("TF_HYPERVISOR_CONFIG", "c.toml", "TF_HYPERVISOR_CONFIG=c.toml: must be an absolute path"),
    ("TF_HYPERVISOR_CONFIG", "/nonexistent/c.toml", "TF_HYPERVISOR_CONFIG=/nonexistent/c.toml: no"),
]


@pytest.mark.parametrize(("variable", "value", "start"), BAD_VARIABLES)
def test_bad_variables(variable: str, value: str, start: str) -> None:
    assert error_of(environ={variable: value}).startswith(start)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("none", ()),
        ("all", ("node", "pods", "workers", "metrics")),
        ("Workers, pods", ("pods", "workers")),
        ("metrics,metrics", ("metrics",)),
    ],
)
def test_open_read_areas(text: str, expected: tuple[str, ...]) -> None:
    assert resolve({"api_open_reads": text}).settings.api_open_reads == expected
    assert resolve({}, environ={"TF_HYPERVISOR_API_OPEN_READS": text}).settings.api_open_reads == (
        expected
    )
    assert Settings().api_open_reads == ()  # closed unless a setting opens them


def test_a_value_with_a_newline_stays_on_one_line() -> None:
    message = error_of(environ={"TF_LOG_LEVEL": "info\ndebug"})
    assert message.startswith('TF_LOG_LEVEL="info\\ndebug": ')


# --- the config file --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "end"),
    [
        (
            "sample_interval_s = -1\n",
            "sample_interval_s = -1: expected seconds between 0.05 and 60",
        ),
        ('api_listen_addr = "h:70000"\n', 'api_listen_addr = "h:70000": port 70000 is out of'),
        ('api_listen_addr = "unix:x.sock"\n', 'api_listen_addr = "unix:x.sock": the unix socket'),
        ("shm_base_path = 5\n", "shm_base_path = 5: expected a path"),
        ('token_file = "token"\n', 'token_file = "token": must be an absolute path'),
        ("[log_level]\nx = 1\n", "log_level = {...}: expected error, warning (or warn)"),
        ("simulate = 2\n", "simulate = 2: expected true, false or auto"),
        ("metrics_rotate_bytes = 1.5\n", "metrics_rotate_bytes = 1.5: expected a number of"),
        ('listen = "x:1"\n', "unknown key 'listen' (did you mean api_listen_addr?)"),
        ('loglevel = "info"\n', "unknown key 'loglevel' (did you mean log_level?)"),
        ("colour = 1\n", "unknown key 'colour'"),
        ('config_file = "/x"\n', "config_file cannot be set in a config file"),
        ("sample_interval_s = \n", "invalid TOML: Invalid value (at line 1, column 21)"),
        ("log_level = 'info'\nlog_level = 'debug'\n", "invalid TOML: Cannot overwrite a value"),
        # Past any float: an OverflowError's traceback before.
        ("sample_interval_s = 1" + "0" * 400 + "\n", ": expected seconds between 0.05 and 60"),
        ("default_gpu_compute = 1" + "0" * 400 + "\n", ": expected whole or a percent from"),
        ('sample_interval_s = "1_0"\n', '"1_0": expected seconds between 0.05 and 60'),
    ],
)
def test_config_file_errors(tmp_path: Path, text: str, end: str) -> None:
    config = write(tmp_path / "hypervisor.toml", text)
    message = error_of({"config_file": str(config)})
    assert message.startswith(f"{config}: ")
    assert end in message


def test_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    config = tmp_path / "hypervisor.toml"
    config.write_bytes(b'log_level = "\xff"\n')
    assert error_of({"config_file": str(config)}) == f"{config}: not UTF-8 text (byte 13)"


def test_missing_or_unreadable_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    assert error_of({"config_file": str(missing)}) == f"--config={missing}: no such file"
    assert (
        error_of({"config_file": str(tmp_path)}) == f"--config={tmp_path}: is a folder, not a file"
    )
    # The default location: absent is fine, a folder there is not.
    with pytest.raises(SettingsError, match="is a folder"):
        resolve(default_config_file=tmp_path)


def test_a_config_file_that_is_no_regular_file_is_refused_without_reading_it(
    tmp_path: Path,
) -> None:
    """/dev/zero or a FIFO as the config file: read without end, or waited on, before."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (Path("/dev/zero"), fifo):
        assert error_of({"config_file": str(path)}) == f"--config={path}: not a regular file"
    large = write(tmp_path / "large.toml", "# " + "x" * (2 << 20) + "\n")
    assert error_of({"config_file": str(large)}).endswith(": larger than 1048576 bytes")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_config_file(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "")
    config.chmod(0)
    assert error_of({"config_file": str(config)}).endswith(": cannot read: Permission denied")


def test_all_keys_in_a_config_file(tmp_path: Path) -> None:
    config = write(
        tmp_path / "c.toml",
        "\n".join(
            [
                'shm_base_path = "/srv/shm/"',
                'api_listen_addr = "unix:/run/tf/hypervisor.sock"',
                'token_file = "/etc/tf/token"',
                'api_open_reads = ["metrics", "node"]',
                'gpu_metrics_file = "/var/log/tf/metrics.log"',
                "metrics_rotate_bytes = 1048576",
                'context_charge = "600MiB"',
                "sample_interval_s = 0.05",
                'log_level = "WARN"',
                'log_format = "JSON"',
                'log_path = "/var/log/tf/hypervisor.log"',
                'simulate = "auto"',
                'sim_state = "/tmp/sim.state"',
                'boost_correction = "off"',
                "kubernetes = true",
                'node_name = "gpu-node-1"',
                'kubeconfig = "/etc/tf/kubeconfig"',
                "kube_backoff_max_s = 5",
                "device_plugin = true",
                'device_plugin_dir = "/var/lib/kubelet/plugins"',
                'device_plugin_lib_dir = "/opt/vgpu/lib"',
                'pod_resources_socket = "/var/lib/kubelet/pr/kubelet.sock"',
                "dra = true",
                'dra_plugins_dir = "/srv/kubelet/plugins"',
                'dra_registry_dir = "/srv/kubelet/plugins_registry"',
                'cdi_dir = "/etc/cdi"',
                'gpu_resource = "example.com/gpu"',
                'gpu_memory_resource = "example.com/gpu-memory"',
                'gpu_compute_resource = "example.com/gpu-compute"',
                "gpu_shares = 4",
                'gpu_memory_unit = "256MiB"',
                'gpu_placement = "spread"',
                'default_gpu_memory = "8GiB"',
                "default_gpu_compute = 12.5",
                "tenant_raise = true",
                "token_review = true",
                'token_review_url = "https://10.0.0.1:6443/apis/authentication.k8s.io/v1/tokenreviews"',
                'token_review_allow = ["ops", "system:masters"]',
            ]
        ),
    )
    resolved = resolve({"config_file": str(config)})
    settings = resolved.settings
    assert settings.shm_base_path == Path("/srv/shm")
    assert settings.api_listen_addr == UnixAddress(Path("/run/tf/hypervisor.sock"))
    assert settings.token_file == Path("/etc/tf/token")
    assert settings.api_open_reads == ("node", "metrics")
    assert settings.gpu_metrics_file == Path("/var/log/tf/metrics.log")
    assert settings.metrics_rotate_bytes == MiB
    assert settings.context_charge == 600 * MiB
    assert settings.sample_interval_s == 0.05
    assert settings.log_level == "warning"
    assert settings.log_format == "json"
    assert settings.log_path == Path("/var/log/tf/hypervisor.log")
    assert settings.simulate is None
    assert settings.sim_state == Path("/tmp/sim.state")
    assert settings.boost_correction is False
    assert settings.kubernetes is True and settings.node_name == "gpu-node-1"
    assert settings.kubeconfig == Path("/etc/tf/kubeconfig")
    assert settings.kube_backoff_max_s == 5.0
    assert settings.device_plugin is True
    assert settings.device_plugin_dir == Path("/var/lib/kubelet/plugins")
    assert settings.device_plugin_lib_dir == Path("/opt/vgpu/lib")
    assert settings.pod_resources_socket == Path("/var/lib/kubelet/pr/kubelet.sock")
    assert settings.dra is True and settings.cdi_dir == Path("/etc/cdi")
    assert settings.dra_plugins_dir == Path("/srv/kubelet/plugins")
    assert settings.dra_registry_dir == Path("/srv/kubelet/plugins_registry")
    assert settings.gpu_resource == "example.com/gpu"
    assert settings.gpu_memory_resource == "example.com/gpu-memory"
    assert settings.gpu_compute_resource == "example.com/gpu-compute"
    assert settings.gpu_shares == 4
    assert settings.gpu_memory_unit == 256 * MiB
    assert settings.gpu_placement == "spread"
    assert settings.default_gpu_memory == 8192 * MiB
    assert settings.default_gpu_compute == 12.5
    assert settings.tenant_raise is True
    assert settings.token_review is True
    assert settings.token_review_url is not None
    assert settings.token_review_allow == ("ops", "system:masters")
    assert {resolved.sources[name] for name in FIELDS if name != "config_file"} == {
        f"file:{config}"
    }


# --- listen addresses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8080", TcpAddress("127.0.0.1", 8080)),
        ("0.0.0.0:1", TcpAddress("0.0.0.0", 1)),
        ("LocalHost:65535", TcpAddress("localhost", 65535)),
        ("node-1.example.com:80", TcpAddress("node-1.example.com", 80)),
        ("[::]:8080", TcpAddress("::", 8080)),
        ("[0:0::1]:08080", TcpAddress("::1", 8080)),
        ("[fe80::1%eth0]:80", TcpAddress("fe80::1%eth0", 80)),
        (
            "unix:/run/tensor-fusion/hypervisor.sock",
            UnixAddress(Path("/run/tensor-fusion/hypervisor.sock")),
        ),
    ],
)
def test_listen_addresses(text: str, expected: object) -> None:
    assert parse_listen_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("localhost", "expected HOST:PORT"),
        ("localhost:", "the port is missing"),
        ("localhost:-1", "port '-1' is not a number"),
        ("localhost:65536", "port 65536 is out of range 1-65535"),
        ("localhost:000000000080", None),
        ("[::1]", "expected :PORT after ']'"),
        ("[::1:80", "missing ']'"),
        ("[1.2.3.4]:80", "is not an IPv6 address"),
        ("[fe80::1%]:80", "is not an IPv6 address"),
        ("01.2.3.4:80", "is not an IPv4 address"),
        ("my_host:80", "is not a valid host name"),
        ("-host:80", "is not a valid host name"),
        ("host.:80", "is not a valid host name"),
        ("unix:", "a unix socket needs a path"),
        ("unix:/" + "x" * 107, "longer than 107 bytes"),
        ("unix:/\ud800", "not valid text"),
    ],
)
def test_bad_listen_addresses(text: str, message: str | None) -> None:
    if message is None:  # leading zeros are harmless
        assert parse_listen_address(text) == TcpAddress("localhost", 80)
        return
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_listen_address(text)


ports = st.integers(1, 65535)
host_names = st.from_regex(
    r"\A[a-zA-Z]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?(\.[a-zA-Z]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?){0,3}\Z"
)


@given(st.ip_addresses(v=4), ports)
def test_ipv4_addresses_parse(address: object, port: int) -> None:
    assert parse_listen_address(f"{address}:{port}") == TcpAddress(str(address), port)


@given(st.ip_addresses(v=6), ports)
def test_ipv6_addresses_need_brackets(address: object, port: int) -> None:
    parsed = parse_listen_address(f"[{address}]:{port}")
    assert parsed == TcpAddress(str(address), port)
    assert str(parsed) == f"[{address}]:{port}"
    with pytest.raises(ValueError, match=r"brackets|not a number|out of range|host is missing"):
        parse_listen_address(f"{address}:{port}")


@given(host_names, ports)
def test_host_names_parse(name: str, port: int) -> None:
    assert parse_listen_address(f"{name}:{port}") == TcpAddress(name.lower(), port)


@given(host_names, st.integers(65536, 10**30) | st.just(0))
def test_ports_out_of_range(name: str, port: int) -> None:
    with pytest.raises(ValueError, match=f"port {port} is out of range 1-65535"):
        parse_listen_address(f"{name}:{port}")


@given(
    st.text(
        st.characters(exclude_characters="\0", exclude_categories=["Cs"]), min_size=1, max_size=100
    )
)
def test_unix_socket_paths(tail: str) -> None:
    path = "/" + tail
    if len(os.fsencode(path)) <= 107:
        assert parse_listen_address(f"unix:{path}") == UnixAddress(Path(path))
    with pytest.raises(ValueError, match="must be absolute"):
        parse_listen_address(f"unix:{tail.lstrip('/') or 'x'}")


@given(st.text(max_size=60))
def test_any_text_parses_canonically_or_fails_in_one_line(text: str) -> None:
    try:
        parsed = parse_listen_address(text)
    except ValueError as error:
        assert "\n" not in str(error)
        assert str(error)
    else:
        assert parse_listen_address(str(parsed)) == parsed


# --- config show ------------------------------------------------------------------------------


@pytest.fixture
def cli() -> typer.Typer:
    """A stand-in for tf-hypervisor: cli.py registers the same sub-app under "config"."""
    application = typer.Typer()

    @application.callback()
    def _group() -> None:
        pass

    application.add_typer(config_app, name="config")
    return application


def invoke(cli: typer.Typer, *args: str, **environment: str) -> Result:
    names = [name for names in ENV_NAMES.values() for name in names]
    names += [name for name in os.environ if name.startswith("TF_HYPERVISOR_")]
    clean: dict[str, str | None] = dict.fromkeys(names)
    clean["TF_HYPERVISOR_CONFIG"] = ""  # never the machine's /etc/tensor-fusion/hypervisor.toml
    return CliRunner().invoke(
        cli, ["config", "show", *args], env={**clean, "COLUMNS": "200", **environment}
    )


def test_config_show_table(cli: typer.Typer, tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", 'sample_interval_s = 0.5\nlog_level = "debug"\n')
    result = invoke(
        cli,
        "--listen",
        "[::1]:9000",
        "--no-simulate",
        TF_HYPERVISOR_CONFIG=str(config),
        TF_LOG_LEVEL="warn",
        API_LISTEN_ADDR="0.0.0.0:8080",
        GPU_METRICS_FILE="/logs/metrics.log",
    )
    assert result.exit_code == 0, result.stderr
    rows = {
        cells[0]: cells[1:]
        for cells in (re.split(r"\s{2,}", line.strip()) for line in result.stdout.splitlines())
        if cells[0] in FIELDS
    }
    assert rows["api_listen_addr"] == ["[::1]:9000", "flag:--listen (over env:API_LISTEN_ADDR)"]
    assert rows["log_level"] == ["warning", f"env:TF_LOG_LEVEL (over file:{config})"]
    assert rows["sample_interval_s"] == ["0.5 s", f"file:{config}"]
    assert rows["gpu_metrics_file"] == ["/logs/metrics.log", "env:GPU_METRICS_FILE"]
    assert rows["metrics_rotate_bytes"] == ["64 MiB", "default"]
    assert rows["simulate"] == ["no", "flag:--no-simulate"]
    assert rows["log_path"] == ["stderr", "default"]
    assert rows["config_file"] == [str(config), "env:TF_HYPERVISOR_CONFIG"]


def test_config_show_json(cli: typer.Typer) -> None:
    result = invoke(cli, "--json", "--metrics-rotate-bytes", "1GiB", SHM_BASE_PATH="/srv/shm")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    settings = document["settings"]
    assert list(settings) == list(FIELDS)
    assert settings["shm_base_path"] == {
        "value": "/srv/shm",
        "source": "env:SHM_BASE_PATH",
        "overridden": [],
        "flag": "--shm-base-path",
        "env": ["TF_HYPERVISOR_SHM_BASE_PATH", "SHM_BASE_PATH"],
    }
    assert settings["metrics_rotate_bytes"]["value"] == 1 << 30
    assert settings["metrics_rotate_bytes"]["source"] == "flag:--metrics-rotate-bytes"
    assert settings["api_listen_addr"]["value"] == "127.0.0.1:8080"
    assert settings["simulate"]["value"] is None
    assert settings["config_file"]["source"] == "env:TF_HYPERVISOR_CONFIG"
    assert document["warnings"] == []


@pytest.mark.parametrize(
    ("args", "environment", "line"),
    [
        (["--listen", "localhost:0"], {}, "--listen=localhost:0: port 0 is out of range 1-65535"),
        (
            ["--sample-interval", "x"],
            {},
            "--sample-interval=x: expected seconds between 0.05 and 60",
        ),
        (
            ["--json"],
            {"TF_LOG_LEVEL": "loud"},
            "TF_LOG_LEVEL=loud: expected error, warning (or warn)",
        ),
    ],
)
def test_config_show_errors(
    cli: typer.Typer, args: list[str], environment: dict[str, str], line: str
) -> None:
    result = invoke(cli, *args, **environment)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {line}")
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_config_show_warns_of_unknown_variables(cli: typer.Typer) -> None:
    result = invoke(cli, "--json", TF_HYPERVISOR_LOGLEVEL="debug")
    assert result.exit_code == 0
    assert result.stderr == (
        "warning: TF_HYPERVISOR_LOGLEVEL is not a tf-hypervisor setting; ignored "
        "(did you mean TF_HYPERVISOR_LOG_LEVEL?)\n"
    )
    assert json.loads(result.stdout)["warnings"]


# --- found by the settings audit ------------------------------------------------------------


@pytest.mark.parametrize("name", ["notk8s.io/gpu", "myk8s.io/gpu", "example.com/k8s.io"])
def test_a_resource_domain_that_merely_ends_in_k8s_io_is_not_reserved(name: str) -> None:
    assert resolve({"gpu_resource": name}).settings.gpu_resource == name


@pytest.mark.parametrize(
    "name", ["k8s.io/gpu", "a.k8s.io/gpu", "kubernetes.io/gpu", "node.kubernetes.io/gpu"]
)
def test_the_reserved_resource_domains_and_their_subdomains_are_refused(name: str) -> None:
    assert error_of({"gpu_resource": name}) == (
        f"--gpu-resource={name}: the kubernetes.io and k8s.io domains are reserved"
    )


@pytest.mark.parametrize("text", ["1_0", "+5", "\u0665", "5.0", "0x5", "5 5"])
def test_gpu_shares_are_ascii_digits(text: str) -> None:
    # int() reads all of these; the setting took them silently (1_0 as 10, U+0665 as 5).
    message = error_of({"gpu_shares": text})
    assert message.startswith("--gpu-shares=")
    assert message.endswith(": expected a whole number from 1 to 1000")


@pytest.mark.parametrize(("text", "expected"), [("5", 5), (" 7 ", 7), ("010", 10), (1000, 1000)])
def test_gpu_shares_in_their_forms(text: object, expected: int) -> None:
    assert resolve({"gpu_shares": text}).settings.gpu_shares == expected


@pytest.mark.parametrize(
    "environment",
    [
        {"KUBECONFIG": "kc.yaml"},  # kubectl's, relative: the daemon's check refuses it
        {"NODE_NAME": "Worker_1"},
        {"TF_LOG_LEVEL": "trace"},
        {"SHM_BASE_PATH": "shm"},
    ],
)
def test_a_client_command_does_not_check_shared_variables_it_does_not_read(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    from vgpu_hypervisor import cli

    names = [name for names in ENV_NAMES.values() for name in names]
    clean: dict[str, str | None] = dict.fromkeys(names)
    flags = ["--config", "", "--listen", "127.0.0.1:1", "--token-file", str(tmp_path / "token")]
    result = CliRunner().invoke(cli.app, ["status", *flags], env={**clean, **environment})
    # No daemon there, no token: the one error is about reaching it, not the variable.
    assert result.exit_code == 1, result.stderr
    assert next(iter(environment)) not in result.stderr
    # The daemon's own names are checked by every command, as config show says.
    result = CliRunner().invoke(
        cli.app, ["status", *flags], env={**clean, "TF_HYPERVISOR_KUBECONFIG": "kc.yaml"}
    )
    assert result.exit_code == 2
    assert result.stderr == "error: TF_HYPERVISOR_KUBECONFIG=kc.yaml: must be an absolute path\n"


@pytest.mark.parametrize(
    ("text", "end"),
    [
        (None, " is a folder"),  # a folder: lightkube said "Configuration file ... not found"
        (
            "apiVersion: v1\nkind: Config\nclusters: []\n",
            ": No current context set and no default provided",
        ),  # was "'contexts'"
    ],
)
def test_a_kubeconfig_that_cannot_be_read_is_said_in_words(
    tmp_path: Path, text: str | None, end: str
) -> None:
    pytest.importorskip("lightkube")
    from vgpu_hypervisor.kubernetes.setup import KubernetesSetupError, open_client

    path = tmp_path / "kubeconfig"
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    with pytest.raises(KubernetesSetupError) as raised:
        open_client(Settings(kubeconfig=path))
    assert str(raised.value) == f"cannot read the Kubernetes config: {path}{end}"


def test_a_kubeconfig_path_that_cannot_be_looked_at_is_said_in_words(tmp_path: Path) -> None:
    # The folder check ran outside the handler: an OSError of the look itself (a name too
    # long here; EACCES for a daemon that is not root) came out as a traceback.
    pytest.importorskip("lightkube")
    from vgpu_hypervisor.kubernetes.setup import KubernetesSetupError, open_client

    path = tmp_path / ("k" * 300)
    with pytest.raises(KubernetesSetupError) as raised:
        open_client(Settings(kubeconfig=path))
    assert str(raised.value).startswith(f"cannot read the Kubernetes config: {path}: ")
    assert "File name too long" in str(raised.value)


def test_a_file_where_the_base_path_or_the_logs_folder_should_be_is_named(tmp_path: Path) -> None:
    from vgpu_hypervisor.daemon.service import DaemonError, _prepare_files, setup_logging

    blocked = tmp_path / "file"
    blocked.write_text("")
    # Each said "File exists", as if the folder were there.
    settings = Settings(shm_base_path=blocked, token_file=tmp_path / "token")
    with pytest.raises(DaemonError) as raised:
        _prepare_files(settings)
    assert (
        str(raised.value)
        == f"cannot create the base path {blocked}: {blocked} is a file, not a folder"
    )
    with pytest.raises(DaemonError) as raised:
        setup_logging(Settings(log_path=blocked / "daemon.log"))
    assert str(raised.value) == (
        f"cannot open log file {blocked / 'daemon.log'}: {blocked} is a file, not a folder"
    )


def test_a_metrics_file_that_cannot_be_written_stops_the_daemon_at_start(tmp_path: Path) -> None:
    # It was logged at every write while the daemon ran on without its metrics.
    from vgpu_hypervisor.daemon.service import DaemonError, _prepare_files

    folder = tmp_path / "metrics"
    folder.mkdir()
    blocked = tmp_path / "file"
    blocked.write_text("")
    for path, why in ((folder, "Is a directory"), (blocked / "m.log", f"{blocked} is a file")):
        settings = Settings(
            shm_base_path=tmp_path / "base", token_file=tmp_path / "token", gpu_metrics_file=path
        )
        with pytest.raises(DaemonError) as raised:
            _prepare_files(settings)
        assert str(raised.value).startswith(f"cannot open the metrics file {path}: {why}")
    good = tmp_path / "new" / "gpu.metrics"
    _prepare_files(Settings(shm_base_path=tmp_path / "base", token_file=tmp_path / "token",
                            gpu_metrics_file=good))  # fmt: skip
    assert good.exists() and good.stat().st_mode & 0o027 == 0  # 0640 at most, as the file says
