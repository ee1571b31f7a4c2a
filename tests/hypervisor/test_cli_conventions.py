"""The CLI's conventions: errors name the flag and value typed (exit 2 for bad input), --version on
-o forms, pods get/describe, and the compute range shared with the limiter."""

import functools
import http.server
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from vgpu_hypervisor import cli

from tests.hypervisor.conftest import TF_HYPERVISOR, Daemon, clean_environment, wait_for


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module: these tests read errors, and clean up what they create."""
    running = Daemon(tmp_path_factory.mktemp("node"))
    running.start()
    try:
        yield running
    finally:
        running.close()


def _error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # one line, no traceback or usage box
    return lines[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--mem", "0=4XB"], ["--mem 0=4XB", "expected a number of bytes"]),
        (["--mem", "0=0.1KiB"], ["--mem 0=0.1KiB"]),
        (["--compute", "1=0.001"], ["--compute 1=0.001", "0.01 to 100"]),
        (["--compute", "0=101"], ["--compute 0=101", "0.01 to 100"]),
        (["--compute", "0=abc"], ["--compute 0=abc"]),
        (["--mem", "4GiB"], ["--mem '4GiB'", "GPU=VALUE"]),
        (["--mem", "GPU-nope=1GiB"], ["--mem GPU-nope=1GiB: bad GPU key 'GPU-nope': a device"]),
        (["--oversubscribe", "zero"], ["--oversubscribe zero: bad GPU key 'zero'"]),
        (["--compute", "0=12.345"], ["--compute 0=12.345", "at most two decimals"]),
        (["--compute", "0=30", "--qos", "urgent"], ["--qos 'urgent': expected low, medium"]),
    ],
)
def test_bad_limits_name_the_flag(node: Daemon, args: list[str], words: list[str]) -> None:
    result = node.cli("pods", "create", "train", *args)
    assert result.returncode == 2
    line = _error(result)
    for word in words:
        assert word in line
    assert "gpus." not in line  # the API's field names are not what was typed
    assert node.cli("pods", "list", "--json").stdout.strip() == "[]"


def test_a_gpu_the_node_lacks_is_named_by_its_flag(node: Daemon) -> None:
    result = node.cli("pods", "create", "train", "--mem", "7=1GiB")
    assert result.returncode == 1
    assert _error(result) == "error: --mem 7=1GiB: no such GPU on this node (2 GPU(s))"
    alone = node.cli("pods", "create", "train", "--oversubscribe", "9")
    assert alone.returncode == 1
    assert _error(alone) == "error: --oversubscribe 9: no such GPU on this node (2 GPU(s))"
    assert node.cli("pods", "list", "--json").stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (
            ["pods", "create", "train", "--mem", "0=1000GiB"],
            1,
            "error: --mem 0=1000GiB: 1000 GiB is more than GPU 0's 80 GiB",
        ),
        (
            ["pods", "create", "train", "--compute", "0=30", "--burst", "0=5"],
            2,
            "error: --burst 0=5: below --compute 0=30",
        ),
        (
            ["pods", "update", "held", "--burst", "0=5"],
            1,
            "error: --burst 0=5: below the pod's compute limit 30 %",
        ),
        (
            ["pods", "update", "held", "--compute", "0=90"],
            1,
            "error: --compute 0=90: above the pod's burst 80 %; give --burst too",
        ),
        (
            ["pods", "create", "train", "--oversubscribe", "0"],
            2,
            "error: --oversubscribe 0: needs a memory limit; give --mem",
        ),
        (
            ["pods", "create", "train", "--mem", "0=none", "--oversubscribe", "0"],
            2,
            "error: --oversubscribe 0: needs a memory limit; give --mem",
        ),
        (
            ["pods", "update", "held", "--oversubscribe", "0"],
            1,
            "error: --oversubscribe 0: needs a memory limit; give --mem",
        ),
        (
            ["pods", "freeze", "held", "--gpu", "7"],
            1,
            "error: --gpu 7: no such GPU on this node (2 GPU(s))",
        ),
        (
            ["pods", "freeze", "held", "--gpu", "1"],
            1,
            "error: --gpu 1: pod default/held has no limits on it",
        ),
        (["workers", "--pod", "nosuch"], 1, "error: --pod nosuch: no pod default/nosuch"),
        (
            ["pods", "update", "held"],
            2,
            "error: nothing to change: give one of --mem, --compute, --burst, --oversubscribe,"
            " --no-oversubscribe, --qos or --weight",
        ),
    ],
)
def test_refusals_name_the_flag_typed(node: Daemon, args: list[str], code: int, line: str) -> None:
    """What the daemon would refuse is checked against the node and the pod first, so the
    line names the flag and value typed, and sizes as sizes."""
    if node.cli("pods", "get", "held").returncode != 0:
        made = node.cli("pods", "create", "held", "--compute", "0=30", "--burst", "0=80")
        assert made.returncode == 0, made.stderr
    result = node.cli(*args)
    assert (result.returncode, _error(result)) == (code, line)
    assert "train" not in node.cli("pods", "list", "-o", "name").stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["pods", "list", "-o", "jsn"],
            "error: -o jsn: expected one of 'table', 'wide', 'json', 'yaml', 'name'"
            " (see 'tf-hypervisor pods list --help')",
        ),
        (
            ["pods", "list", "--output=jsn"],
            "error: --output jsn: expected one of 'table', 'wide', 'json', 'yaml', 'name'"
            " (see 'tf-hypervisor pods list --help')",
        ),
        (
            ["pods", "creat"],
            "error: creat: no such command; did you mean 'create'?"
            " (see 'tf-hypervisor pods --help')",
        ),
        (
            ["top", "--interval", "0"],
            "error: --interval 0: expected seconds from 0.1 to 60 (see 'tf-hypervisor top --help')",
        ),
        (  # the daemon's 422 named the GPU's UUID, with exit 1
            ["pods", "create", "e", "--burst", "0=50"],
            "error: --burst 0=50: a burst needs a compute limit; give --compute",
        ),
        (  # the API's field named, with exit 1
            ["pods", "create", "p", "--owner", "99999999999", "--mem", "0=1GiB"],
            "error: --owner: user id 99999999999 is past the largest, 4294967294",
        ),
        (  # click's range read nan as past its maximum
            ["top", "--interval", "nan"],
            "error: --interval nan: expected seconds from 0.1 to 60"
            " (see 'tf-hypervisor top --help')",
        ),
        (
            ["pods", "list", "--namespce", "x"],
            "error: --namespce: no such flag; did you mean --all-namespaces or --namespace?"
            " (see 'tf-hypervisor pods list --help')",
        ),
        (
            ["pods", "get"],
            "error: missing argument '[NAMESPACE/]NAME' (see 'tf-hypervisor pods get --help')",
        ),
    ],
)
def test_usage_errors_are_one_line(args: list[str], line: str) -> None:
    """Typer's boxed usage errors in the one-line form of the others, naming what was typed."""
    result = subprocess.run(
        [*TF_HYPERVISOR, *args], env=clean_environment(), capture_output=True, text=True,
        check=False, timeout=60,
    )  # fmt: skip
    assert (result.returncode, _error(result)) == (2, line)


def test_the_cli_sends_the_numbers_it_parsed() -> None:
    parsed = cli._gpu_limits(
        ["0=4GiB", "1=none"], ["0=12.5", "1=100"], ["GPU-AAAAAAAA-1111-2222-3333-444444444444"],
        burst=["0=none"],
    )  # fmt: skip
    assert parsed.gpus == {
        "0": {"memory": 4 << 30, "compute": 12.5, "burst": "none"},
        "1": {"memory": "none", "compute": "none"},
        "GPU-aaaaaaaa-1111-2222-3333-444444444444": {"oversubscribe": True},
    }
    assert parsed.named_by["GPU-aaaaaaaa-1111-2222-3333-444444444444"] == (
        "--oversubscribe GPU-AAAAAAAA-1111-2222-3333-444444444444"
    )


@pytest.mark.parametrize(
    ("pod", "shown"),
    [
        ("Bad_Name!", "bad pod name 'Bad_Name!'"),
        (".hidden", "bad pod name '.hidden'"),
        ("team/..", "bad pod name '..'"),
        ("a" * 254, "bad pod name"),
        ("bad ns/train", "bad namespace 'bad ns' (in 'bad ns/train')"),
    ],
)
def test_pod_names_are_explained_in_words(node: Daemon, pod: str, shown: str) -> None:
    result = node.cli("pods", "create", pod, "--mem", "0=1GiB")
    assert result.returncode == 2
    line = _error(result)
    assert shown in line and "letters, digits" in line and "^[" not in line


def test_delete_refusal_names_force(daemon: Daemon) -> None:
    assert daemon.cli("pods", "create", "busy", "--mem", "0=2GiB").returncode == 0
    worker = daemon.workload("busy", "--alloc", "1GiB", "--hold", "60")
    try:
        wait_for(lambda: "default/busy" in daemon.cli("workers").stdout, timeout=30)
        result = daemon.cli("pods", "delete", "busy")
        assert result.returncode == 1
        line = _error(result)
        assert "--force" in line and "with force" not in line
        assert daemon.cli("pods", "delete", "busy", "--force").returncode == 0
    finally:
        worker.kill()
        worker.communicate(timeout=10)


def test_output_forms_and_describe(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "team/train", "--mem", "0=4GiB", "--compute", "0=12.5")
    assert created.returncode == 0, created.stderr
    as_json = json.loads(daemon.cli("pods", "get", "team/train", "-o", "json").stdout)
    assert as_json == json.loads(daemon.cli("pods", "get", "team/train", "--json").stdout)
    assert yaml.safe_load(daemon.cli("pods", "get", "team/train", "-o", "yaml").stdout) == as_json
    assert as_json["gpus"][0]["compute_limit"] == 12.5
    wide = daemon.cli("pods", "list", "-n", "team", "-o", "wide").stdout
    assert as_json["gpus"][0]["uuid"] in wide and as_json["path"] in wide
    assert "UUID" not in daemon.cli("pods", "list").stdout
    described = daemon.cli("pods", "describe", "team/train").stdout
    for words in (
        "Name:       train",
        "Namespace:  team",
        "Memory limit:   4 GiB",
        "Compute limit:  12.5 %",
        "Flags:      none",
        "Created:",
        "Worker processes: (none)",
        "QoS:        medium (weight 2)",
        "Burst limit:    none",
        "Oversubscribe:  off (0 B in host memory)",
        "Throttled:      0.0 s",
        "OOM refusals:   0",
    ):
        assert words in described, described
    names = daemon.cli("pods", "list", "-A", "-o", "name")
    assert names.stdout == "team/train\n", names
    assert daemon.cli("pods", "list", "-o", "name").stdout == ""  # the default namespace
    assert daemon.cli("pods", "list", "-n", "team", "-o", "name").stdout == "team/train\n"
    both = daemon.cli("pods", "list", "-n", "team", "-A")
    assert both.returncode == 2 and "--all-namespaces" in _error(both)
    gpus = yaml.safe_load(daemon.cli("gpus", "-o", "yaml").stdout)
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    conflict = daemon.cli("pods", "list", "--json", "-o", "yaml")
    assert conflict.returncode == 2 and "--json" in _error(conflict)
    bad = daemon.cli("pods", "list", "-o", "xml")
    assert bad.returncode == 2 and "xml" in bad.stderr


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("0.01", True),
        ("12.5", True),
        ("100", True),
        ("0.001", False),
        ("0", False),
        ("100.5", False),
    ],
)
def test_compute_range_is_the_limiters(node: Daemon, value: str, accepted: bool) -> None:
    """The daemon's CLI and tf-limiter agree on every compute value."""
    hypervisor = node.cli("pods", "create", "range", "--compute", f"0={value}")
    if hypervisor.returncode == 0:
        assert node.cli("pods", "delete", "range").returncode == 0
    limiter = subprocess.run(
        [sys.executable, "-m", "vgpu_limiter", "run", "--compute", f"0={value}", "--", "true"],
        env=clean_environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (hypervisor.returncode == 0) is accepted, hypervisor.stderr
    assert (limiter.returncode == 0) is accepted, limiter.stderr
    if not accepted:
        assert f"--compute 0={value}" in _error(hypervisor)
        assert f"--compute 0={value}" in _error(limiter)


def test_watch_prints_the_listing_again_when_it_changes(daemon: Daemon) -> None:
    watching = subprocess.Popen(
        [*TF_HYPERVISOR, "pods", "list", "-w", "-o", "name", *daemon.flags],
        env=daemon.environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout = watching.stdout
        assert stdout is not None
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.extend(iter(stdout.readline, "")))
        reader.start()
        assert daemon.cli("pods", "create", "first", "--mem", "0=1GiB").returncode == 0
        wait_for(lambda: "default/first\n" in seen, timeout=30)
        assert daemon.cli("pods", "create", "second", "--mem", "0=1GiB").returncode == 0
        wait_for(lambda: seen.count("default/first\n") == 2 and "default/second\n" in seen, 30)
    finally:
        watching.send_signal(signal.SIGINT)
        assert watching.wait(timeout=30) == 0
        reader.join(timeout=10)
    assert watching.stderr is not None and watching.stderr.read() == ""


def test_a_listener_that_is_not_the_daemon_is_named_in_one_line(tmp_path: Path) -> None:
    """Something else answering at --listen (a file server): tracebacks before (TypeError,
    AttributeError), or a page's first line as the error."""
    (tmp_path / "api" / "v1" / "pods" / "default").mkdir(parents=True)
    for name in ("status", "gpus", "pods/default/x"):
        (tmp_path / "api" / "v1" / name).write_text("hi\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    listen = f"127.0.0.1:{server.server_address[1]}"
    try:
        for args in (["status"], ["gpus"], ["pods", "get", "x"], ["pods", "delete", "x"]):
            result = subprocess.run(
                [*TF_HYPERVISOR, *args, "--listen", listen, "--token-file", str(token)],
                check=False,
                capture_output=True,
                text=True,
                env=clean_environment(),
                timeout=60,
            )
            assert result.returncode == 1, (args, result.stderr)
            line = _error(result)
            assert line.startswith(f"error: {listen} "), line
            assert "not a tf-hypervisor" in line, line
    finally:
        server.shutdown()


@pytest.mark.parametrize("content", [b"\xff\xfe", b"a\nb\n", "t\u00f6k".encode()])
def test_a_token_file_holding_no_token_is_one_line(
    node: Daemon, tmp_path: Path, content: bytes
) -> None:
    """A token file that is not ASCII was a UnicodeDecodeError traceback; one of two lines was
    sent, and its text echoed in the error."""
    token = tmp_path / "token"
    token.write_bytes(content)
    result = subprocess.run(
        [*TF_HYPERVISOR, "pods", "create", "p", "--mem", "0=1GiB", "--listen",
         f"127.0.0.1:{node.port}", "--token-file", str(token)],
        check=False, capture_output=True, text=True, env=node.environment, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    line = _error(result)
    assert (
        line
        == f"error: the API token file {token}: not a token: only printable ASCII without blanks is"
    )


def test_a_gpu_named_by_index_and_by_uuid_is_one_gpu(node: Daemon) -> None:
    """`--mem 0=… --compute GPU-…=…` for one GPU was sent as two keys and refused by the API,
    naming its own field (`gpus.GPU-…: GPU … is given twice`) rather than the flags typed."""
    uuid = node.api("GET", "/api/v1/gpus").json()[0]["uuid"]
    made = node.cli(
        "pods", "create", "both", "--mem", "0=1GiB", "--compute", f"{uuid}=20", "-o", "json"
    )
    try:
        assert made.returncode == 0, made.stderr
        [gpu] = json.loads(made.stdout)["gpus"]
        assert (gpu["uuid"], gpu["memory_limit"], gpu["compute_limit"]) == (uuid, 1 << 30, 20)
        changed = node.cli(
            "pods", "update", "both", "--mem", f"{uuid.lower()}=2GiB", "--compute", "0=30",
            "-o", "json",
        )  # fmt: skip
        assert changed.returncode == 0, changed.stderr
        [gpu] = json.loads(changed.stdout)["gpus"]
        assert (gpu["memory_limit"], gpu["compute_limit"]) == (2 << 30, 30)
        twice = node.cli("pods", "update", "both", "--mem", "0=1GiB", "--mem", f"{uuid}=3GiB")
        assert twice.returncode == 2
        assert _error(twice) == f"error: --mem {uuid}=3GiB: the same GPU as --mem 0=1GiB"
    finally:
        node.cli("pods", "delete", "both")


@pytest.mark.parametrize(
    ("args", "form"),
    [
        *((args, form) for args in (["status"], ["pods", "describe", "shown"], ["shm", "show"])
          for form in ("wide", "name")),
        (["pods", "delete", "shown"], "wide"),
    ],
)  # fmt: skip
def test_one_document_refuses_the_listing_forms(node: Daemon, args: list[str], form: str) -> None:
    """status, describe and shm show took -o wide and -o name and printed their table without
    a word; delete names the pod it deleted (below) but has no wide table."""
    if args[0] == "shm":  # no daemon: the base path, not the client's flags
        command = [*TF_HYPERVISOR, *args, "default/shown", "--shm-base-path", str(node.base)]
        result = subprocess.run(
            [*command, "--config", "", "-o", form],
            env=node.environment,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    else:
        result = node.cli(*args, "-o", form)
    assert result.returncode == 2, result.stdout
    assert _error(result).startswith(f"error: -o {form}: expected one of 'table', 'json', 'yaml'")


def test_delete_names_the_deleted_pod(node: Daemon) -> None:
    assert node.cli("pods", "create", "named", "--mem", "0=1GiB").returncode == 0
    deleted = node.cli("pods", "delete", "named", "-o", "name")
    assert (deleted.returncode, deleted.stdout) == (0, "default/named\n"), deleted.stderr


def test_top_off_a_terminal_without_input_prints_the_view_once(node: Daemon) -> None:
    """`top > file < /dev/null` (cron, a CI step) waited for ever and printed nothing: off a
    terminal rich's Live shows only its last frame, and nothing could ask top to quit."""
    assert node.cli("pods", "create", "viewed", "--mem", "0=1GiB").returncode == 0
    try:
        shown = node.cli("top", "--interval", "0.2", stdin="", timeout=15)
        assert shown.returncode == 0, shown.stderr
        assert "default/viewed" in shown.stdout
    finally:
        node.cli("pods", "delete", "viewed")


class _Answers(http.server.BaseHTTPRequestHandler):
    """Another service on the daemon's port, or a daemon of another version: the same reply,
    ``status`` and JSON ``body``, to every request."""

    status = 200
    body = b"{}"

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _answering(
    tmp_path: Path, status: int, body: bytes
) -> tuple[http.server.HTTPServer, list[str]]:
    """A server that answers so, and the flags that send the CLI to it."""
    handler = type("Answers", (_Answers,), {"status": status, "body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    return server, ["--listen", f"127.0.0.1:{server.server_address[1]}", "--token-file", str(token)]


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TF_HYPERVISOR, *args],
        check=False,
        capture_output=True,
        text=True,
        env=clean_environment(),
        input=stdin,
        timeout=60,
    )


SHAPED_COMMANDS = [
    ["status"],
    ["gpus"],
    ["workers"],
    ["pods", "list"],
    ["pods", "get", "x"],
    ["pods", "describe", "x"],
    ["pods", "create", "x", "--mem", "0=1GiB"],
    ["pods", "update", "x", "--qos", "high"],
    ["pods", "delete", "x"],
]


@pytest.mark.parametrize("body", [b'{"a": 1}', b'[{"a": 1}]', b'{"ready": "yes"}'])
def test_a_reply_of_another_shape_is_one_line_naming_what_differs(
    tmp_path: Path, body: bytes
) -> None:
    """Each reply is checked against the API's models where it comes in: before, `status`
    failed with KeyError 'ready', `pods list` KeyError 'namespace', `describe` KeyError 'name',
    create/update/workers/gpus with AttributeError tracebacks, and `pods delete x` printed that
    it had deleted the pod."""
    server, flags = _answering(tmp_path, 200, body)
    try:
        for args in SHAPED_COMMANDS:
            result = _run(*args, *flags)
            assert result.returncode == 1, (args, result.stdout, result.stderr)
            line = _error(result)
            assert line.startswith(f"error: http://{flags[1]}/api/v1/"), line
            assert "answered a document that is not tf-hypervisor's: " in line, line
            assert result.stdout == "", (args, result.stdout)
    finally:
        server.shutdown()


def test_top_shows_a_reply_of_another_shape_and_keeps_going(tmp_path: Path) -> None:
    """`top` exited with a traceback; it shows the reason as for a daemon it cannot reach."""
    server, flags = _answering(tmp_path, 200, b'[{"a": 1}]')
    try:
        shown = _run("top", "--interval", "0.2", *flags, stdin="")
        assert shown.returncode == 0, shown.stderr
        assert shown.stderr == ""
        assert "not tf-hypervisor's" in shown.stdout
    finally:
        server.shutdown()


def test_an_error_relayed_is_one_line_of_visible_text(tmp_path: Path) -> None:
    """An error message with a newline printed on two lines, and one with an escape sequence
    ran it in the terminal."""
    body = json.dumps({"error": "boom\n  second line\x1b]0;PWNED\x07"}).encode()
    server, flags = _answering(tmp_path, 409, body)
    try:
        result = _run("pods", "delete", "x", *flags)
        assert result.returncode == 1
        assert _error(result) == "error: boom second line\\x1b]0;PWNED\\x07"
    finally:
        server.shutdown()
