"""tf-hypervisor: the daemon, and its command-line client.

Client commands find the daemon and its token through the daemon's settings (`--listen` or
API_LISTEN_ADDR, `--token-file`, the config file). Every failure is one line on stderr and a
non-zero exit code: 2 for bad input, 1 for a request the daemon refused or could not answer.
"""

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from vgpu_common.cli import USAGE_ERROR, fail
from vgpu_common.command_app import command_app, run_app, sub_app
from vgpu_common.limits import (
    MAX_WEIGHT,
    NONE_WORD,
    QOS_NAMES,
    format_percent,
    format_size,
    hundredths_to_percent,
    names_gpu,
    parse_burst_limit,
    parse_compute_limit,
    parse_gpu_key,
    parse_memory_limit,
    parse_qos,
)
from vgpu_common.visible import visible

from vgpu_hypervisor import package_version
from vgpu_hypervisor.client import output
from vgpu_hypervisor.client.names import check_pod_name
from vgpu_hypervisor.client.output import (
    DeletedOutputOption,
    DocumentOutputOption,
    OutputOption,
)
from vgpu_hypervisor.settings import (
    ENV_NAMES,
    ENV_PREFIX,
    Settings,
    SettingsError,
    load_settings,
    resolve_settings,
)
from vgpu_hypervisor.settings_cli import (
    CLIENT_SETTINGS,
    JsonFlag,
    settings_flags,
)
from vgpu_hypervisor.settings_cli import (
    app as config_app,
)

if TYPE_CHECKING:  # the HTTP client and rich load only for the commands that use them
    from vgpu_hypervisor.client.api_client import Client

API = "/api/v1"
REFUSED = 1  # the daemon said no, or could not be reached

app = command_app(
    "tf-hypervisor", "vgpu-hypervisor", "The vgpu node daemon and its command-line client."
)
pods_app = sub_app("List, create, change and delete pods.")
shm_app = sub_app("Pod region files, read directly (no daemon needed).")


def _settings(flags: Mapping[str, object]) -> Settings:
    """The settings of a client command, whose ``flags`` name the settings it reads."""
    # A shared variable (KUBECONFIG=kc.yaml for kubectl, NODE_NAME) is checked only where it is
    # used (docs/configuration.md): a client reads just its own settings, and failed on such a
    # variable meant for another tool. The daemon's own TF_HYPERVISOR_* names are still checked.
    unread = {
        variable
        for name, variables in ENV_NAMES.items()
        if name not in flags
        for variable in variables
        if not variable.startswith(ENV_PREFIX)
    }
    environ = {name: value for name, value in os.environ.items() if name not in unread}
    try:
        return load_settings(flags, environ)
    except SettingsError as error:
        fail(str(error))


def _call(
    flags: Mapping[str, object],
    action: Callable[["Client"], Any],
    explain: Callable[[str], str] = lambda message: message,
) -> Any:
    """The action's result; a failure is one line (through ``explain``) and exit code 1."""
    from vgpu_hypervisor.client.api_client import Client, ClientError

    with Client(_settings(flags)) as client:
        try:
            return action(client)
        except ClientError as error:
            fail(explain(str(error)), REFUSED)


WatchOption = Annotated[
    bool,
    typer.Option("--watch", "-w", help="After the listing, print it again each time it changes."),
]


def _list(
    flags: Mapping[str, object],
    take: Callable[["Client"], Any],
    form: output.Form,
    kind: str,
    *,
    watch: bool = False,
    explain: Callable[[str], str] = lambda message: message,
) -> None:
    """A listing (gpus, pods, workers) in ``form``, once or, with ``watch``, at each change."""
    from vgpu_hypervisor.client.api_client import Client, ClientError
    from vgpu_hypervisor.client.tables import gpu_indexes
    from vgpu_hypervisor.client.watch import watch as watching

    with Client(_settings(flags)) as client:

        def document() -> tuple[Any, dict[str, int] | None]:
            try:
                found = take(client)
                # Workers name their GPUs by UUID; the table shows the node's indexes.
                indexes = None
                if kind == "workers" and form in (output.Form.table, output.Form.wide):
                    indexes = gpu_indexes(client.gpus())
                return found, indexes
            except ClientError as error:
                fail(explain(str(error)), REFUSED)

        def show(taken: tuple[Any, dict[str, int] | None]) -> None:
            output.show(taken[0], form, kind, taken[1])

        if watch:
            watching(document, show, flush=sys.stdout.flush)
        else:
            show(document())


# --- daemon and status -----------------------------------------------------------------------


@app.command()
@settings_flags()
def daemon(*, flags: Mapping[str, object]) -> None:
    """Run the node daemon (until SIGTERM or Ctrl-C)."""
    from vgpu_hypervisor.daemon.service import DaemonError, run

    try:
        resolved = resolve_settings(flags)
    except SettingsError as error:
        fail(str(error))
    try:
        run(resolved.settings, resolved.warnings, resolved.sources)
    except DaemonError as error:
        fail(str(error), REFUSED)
    except KeyboardInterrupt:
        pass


@app.command()
@settings_flags(*CLIENT_SETTINGS)
def status(
    *, flags: Mapping[str, object], as_json: JsonFlag = False, form: DocumentOutputOption = None
) -> None:
    """The daemon's state: version, GPU backend, pods and workers, readiness."""
    document = _call(flags, lambda client: client.status())
    if output.print_document(document, output.choose(form, as_json)):
        return
    ready = "ready" if document["ready"] else "NOT READY"
    lines = (
        f"tf-hypervisor {document['version']}, up {document['uptime_s']:.0f} s, {ready}",
        document["backend_description"],
        f"{document['gpus']} GPU(s), {document['pods']} pod(s)"
        f" ({document['pods_with_errors']} with errors), {document['workers']} worker(s);"
        f" regions under {document['shm_base_path']}",
    )
    for line in lines:  # the words of whatever answered, shown as the tables show theirs
        print(visible(line))


@app.command()
@settings_flags(*CLIENT_SETTINGS)
def gpus(
    *,
    flags: Mapping[str, object],
    as_json: JsonFlag = False,
    form: OutputOption = None,
    watch: WatchOption = False,
) -> None:
    """The node's GPUs with memory, utilization and the pods on each."""
    chosen = output.choose(form, as_json)
    _list(flags, lambda client: client.gpus(), chosen, "gpus", watch=watch)


@app.command()
@settings_flags(*CLIENT_SETTINGS)
def workers(
    *,
    flags: Mapping[str, object],
    pod: Annotated[
        str | None, typer.Option("--pod", metavar="[NAMESPACE/]NAME", help="Only this pod.")
    ] = None,
    as_json: JsonFlag = False,
    form: OutputOption = None,
    watch: WatchOption = False,
) -> None:
    """Processes running in pods, with their GPU memory and utilization."""
    namespace, name = _pod_name(pod) if pod else (None, None)

    def listing(client: "Client") -> Any:
        if name is not None:  # a pod that is not there is an error, not an empty table
            client.pod(namespace or "default", name)
        return client.workers(namespace, name)

    chosen = output.choose(form, as_json)
    _list(
        flags,
        listing,
        chosen,
        "workers",
        watch=watch,
        # The pod named is what a 404 is about; a daemon out of reach is not.
        explain=lambda message: (
            f"--pod {pod}: {message}" if message.startswith("no pod") else message
        ),
    )


def _seconds_given(value: float) -> float:
    """Seconds between refreshes, 0.1 to 60 (click's range read nan as past its maximum)."""
    if not 0.1 <= value <= 60:  # false for nan too
        raise typer.BadParameter("expected seconds from 0.1 to 60")
    return value


@app.command()
@settings_flags(*CLIENT_SETTINGS)
def top(
    *,
    flags: Mapping[str, object],
    interval: Annotated[
        float,
        typer.Option(
            "--interval", callback=_seconds_given, help="Seconds between refreshes, 0.1 to 60."
        ),
    ] = 1.0,
) -> None:
    """A live view of GPUs, pods and workers that fits the terminal; h shows the keys.

    Keys: q quits, s sorts (name, memory, util), r reverses, / filters by pod name, c switches
    compact/full. A daemon that is not (yet) there is retried every interval."""
    from vgpu_hypervisor.client.api_client import Client
    from vgpu_hypervisor.client.top import run_top

    # A short timeout: a hung daemon shows as unreachable rather than freezing the view.
    with Client(_settings(flags), timeout=max(1.0, min(5.0, 2 * interval))) as client:
        run_top(client, interval=interval)


@app.command()
def version() -> None:
    """Print the installed version (as --version)."""
    print(package_version())


# --- pods ------------------------------------------------------------------------------------

NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", metavar="NAMESPACE", help="Default: 'default'."),
]
PodArgument = Annotated[str, typer.Argument(metavar="[NAMESPACE/]NAME", show_default=False)]
MemOption = Annotated[
    list[str] | None,
    typer.Option(
        "--mem",
        metavar="GPU=SIZE",
        help="Memory limit of a GPU (index or UUID), e.g. 0=4GiB; 0=none removes it. Repeatable.",
        show_default=False,
    ),
]
ComputeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--compute",
        metavar="GPU=PERCENT",
        help="Compute limit of a GPU in percent, e.g. 0=30; 0=none (or 100) removes it. "
        "Repeatable.",
        show_default=False,
    ),
]
BurstOption = Annotated[
    list[str] | None,
    typer.Option(
        "--burst",
        metavar="GPU=PERCENT",
        help="Soft limit of a GPU in percent (at least the compute limit): the pod's share while "
        "no other pod wants the GPU, e.g. 0=100; 0=none removes it. Repeatable.",
        show_default=False,
    ),
]
QosOption = Annotated[
    str | None,
    typer.Option(
        "--qos",
        metavar="CLASS",
        help=f"Scheduling class: {', '.join(QOS_NAMES)} (weight 1/2/4/8 when the limits of "
        "the pods that want a GPU add up past 98 %).",
        show_default=False,
    ),
]
WeightOption = Annotated[
    int | None,
    typer.Option(
        "--weight",
        metavar="N",
        help="Explicit scheduling weight (0: the class's).",
        show_default=False,
    ),
]


def _policy(qos: str | None, weight: int | None) -> dict[str, object]:
    """The request's qos and weight, as parsed here (the daemon checks them again)."""
    body: dict[str, object] = {}
    if qos is not None:
        try:
            body["qos"] = parse_qos(qos).label
        except ValueError as error:
            fail(f"--qos {qos!r}: {error}")
    if weight is not None:
        if not 0 <= weight <= MAX_WEIGHT:
            fail(f"--weight {weight}: 0 (the class's) to {MAX_WEIGHT}")
        body["weight"] = weight
    return body


OversubscribeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--oversubscribe",
        metavar="GPU",
        help="Past the memory limit of a GPU (index or UUID), serve allocations from host "
        "memory instead of failing (docs/oversubscription.md). Repeatable.",
        show_default=False,
    ),
]
NoOversubscribeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--no-oversubscribe",
        metavar="GPU",
        help="Turn oversubscription off for a GPU: past the limit is out of memory again. "
        "Repeatable.",
        show_default=False,
    ),
]


def _pod_name(text: str, namespace: str | None = None) -> tuple[str, str]:
    """(namespace, name) of a [NAMESPACE/]NAME argument, each checked as the daemon would."""
    if "/" in text:
        given, _, name = text.partition("/")
        if namespace is not None and namespace != given:
            fail(f"pod {text!r} and --namespace {namespace!r} disagree")
        namespace = given
    else:
        name = text
    if namespace is not None:
        check_pod_name("namespace", namespace, text if "/" in text else f"--namespace {namespace}")
    check_pod_name("pod name", name, text)
    return namespace or "default", name


# The limit flags: the API's field each sets, its parser (vgpu_common.limits, the API's own),
# and an example for the usage line.
_LIMIT_FLAGS: tuple[tuple[str, str, Callable[[str], int | None], str], ...] = (
    ("--mem", "memory", parse_memory_limit, "4GiB"),
    ("--compute", "compute", parse_compute_limit, "30"),
    ("--burst", "burst", parse_burst_limit, "100"),
)


@dataclass
class _GpuFlags:
    """The request's ``gpus`` as parsed from the flags (JSON numbers: bytes and percents,
    "none" for no limit), the flag that first named each GPU key, and what was typed for
    each field of each key."""

    gpus: dict[str, dict[str, object]] = field(default_factory=dict)
    named_by: dict[str, str] = field(default_factory=dict)
    typed: dict[tuple[str, str], str] = field(default_factory=dict)

    def set(self, flag: str, typed: str, key: str, name: str, value: object) -> None:
        """The API field ``name`` of GPU ``key`` from ``flag`` (``typed``: flag and value)."""
        try:
            gpu = parse_gpu_key(key)
        except ValueError as error:
            fail(f"{typed}: {error}")
        limits = self.gpus.setdefault(gpu, {})
        if name in limits:
            fail(f"{flag}: GPU {key} given twice")
        limits[name] = value
        self.named_by.setdefault(gpu, typed)
        self.typed[gpu, name] = typed

    def merge(self, key: str, into: str) -> None:
        """GPU ``key``'s limits moved to ``into``, a key of the same GPU (its index and its
        UUID, found the same once the node's GPUs are known): the API takes one key a GPU, and
        answered two with an error naming its own field, not the flags typed. A limit both
        give is an error naming both."""
        for name, value in self.gpus.pop(key).items():
            if name in self.gpus[into]:
                fail(f"{self.typed[key, name]}: the same GPU as {self.typed[into, name]}")
            self.gpus[into][name] = value
            self.typed[into, name] = self.typed.pop((key, name))
        del self.named_by[key]


def _gpu_limits(
    mem: list[str] | None,
    compute: list[str] | None,
    oversubscribe: list[str] | None = None,
    no_oversubscribe: list[str] | None = None,
    burst: list[str] | None = None,
    *,
    required: str | None = "give at least one --mem, --compute, --burst or --oversubscribe",
) -> _GpuFlags:
    """The request's `gpus` from --mem, --compute, --burst and --[no-]oversubscribe, each
    value parsed here, so that a bad one is named by the flag and value typed; ``required``:
    the error when none is given."""
    parsed = _GpuFlags()
    given = {"--mem": mem, "--compute": compute, "--burst": burst}
    for flag, name, parse, example in _LIMIT_FLAGS:
        for spec in given[flag] or []:
            key, equals, value = (part.strip() for part in spec.partition("="))
            if not equals or not key or not value:
                fail(f"{flag} {spec!r}: expected GPU=VALUE, e.g. {flag} 0={example}")
            try:
                limit = parse(value)
            except ValueError as error:
                fail(f"{flag} {spec}: {error}")
            if limit is None:
                sent: object = NONE_WORD
            else:  # the API's units: bytes, and percent
                sent = limit if name == "memory" else hundredths_to_percent(limit)
            parsed.set(flag, f"{flag} {spec}", key, name, sent)
    for flag, on, keys in (
        ("--oversubscribe", True, oversubscribe),
        ("--no-oversubscribe", False, no_oversubscribe),
    ):
        for key in keys or []:
            if not key.strip() or "=" in key:
                fail(f"{flag} {key!r}: expected a GPU index or UUID, e.g. {flag} 0")
            parsed.set(flag, f"{flag} {key.strip()}", key.strip(), "oversubscribe", on)
    if not parsed.gpus and required:
        fail(required)
    for gpu in parsed.gpus:
        _burst_fits(parsed, gpu, None)
    return parsed


def _percent_of(value: object) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _burst_fits(flags: _GpuFlags, gpu: str, present: dict[str, Any] | None) -> None:
    """A burst is at least the compute limit it goes with: the one given beside it, else the
    pod's own on that GPU (``present``: the pod's GPU document, None before it exists)."""
    limits = flags.gpus[gpu]
    burst, compute = limits.get("burst"), limits.get("compute")
    if compute is None and present is not None:
        compute = present.get("compute_limit")
    if burst is None and present is not None and "compute" in limits:
        burst = present.get("compute_burst")  # a burst left as it is goes with the limit
    burst_percent, compute_percent = _percent_of(burst), _percent_of(compute)
    if burst_percent is None:
        if "burst" in limits and burst != NONE_WORD and present is not None and compute is None:
            fail(
                f"{flags.typed[gpu, 'burst']}: a burst needs a compute limit; give --compute",
                REFUSED,
            )
        return
    if compute_percent is None or burst_percent >= compute_percent:
        return
    shown = format_percent(compute_percent)
    code = USAGE_ERROR if present is None else REFUSED  # against the pod's: the daemon's no
    if (gpu, "burst") in flags.typed and (gpu, "compute") in flags.typed:
        fail(f"{flags.typed[gpu, 'burst']}: below {flags.typed[gpu, 'compute']}", code)
    if (gpu, "burst") in flags.typed:
        fail(f"{flags.typed[gpu, 'burst']}: below the pod's compute limit {shown}", code)
    fail(
        f"{flags.typed[gpu, 'compute']}: above the pod's burst {format_percent(burst_percent)};"
        " give --burst too",
        code,
    )


def _on_this_node(client: "Client", flags: _GpuFlags, pod: dict[str, Any] | None = None) -> None:
    """Every GPU the flags name is one of the daemon's (an index and a UUID of one GPU are
    merged into one entry), a memory limit fits its GPU, and a
    burst its compute limit (``pod``: the pod changed, None for a new one). Only the daemon
    knows its GPUs, so they are asked for first, and a problem is named by the flag that
    made it (the daemon checks again, naming the API's field)."""
    if not flags.named_by:
        return
    gpus = client.gpus(authorized=True)  # a change's: with the token
    found: dict[str, dict[str, Any]] = {}  # the GPU of each key left after merging
    for key, typed in list(flags.named_by.items()):
        gpu = next((g for g in gpus if names_gpu(key, g.get("index"), g.get("uuid"))), None)
        if gpu is None:
            fail(f"{typed}: no such GPU on this node ({len(gpus)} GPU(s))", REFUSED)
        same = next((other for other, known in found.items() if known is gpu), None)
        if same is None:
            found[key] = gpu
        else:
            flags.merge(key, same)
    for key, gpu in found.items():
        memory, total = flags.gpus[key].get("memory"), gpu.get("memory_total")
        if isinstance(memory, int) and total and memory > total:
            fail(
                f"{flags.typed[key, 'memory']}: {format_size(memory)} is more than"
                f" GPU {gpu['index']}'s {format_size(total)}",
                REFUSED,
            )
        present: dict[str, Any] | None = None
        if pod is not None:
            present = next((g for g in pod["gpus"] or [] if g["uuid"] == gpu.get("uuid")), {})
            _burst_fits(flags, key, present)
        _oversubscription_fits(flags, key, present)


def _oversubscription_fits(flags: _GpuFlags, gpu: str, present: dict[str, Any] | None) -> None:
    """--oversubscribe serves what is past a memory limit: the one given beside it, else the
    pod's own on that GPU (``present``, None before the pod exists)."""
    limits = flags.gpus[gpu]
    if limits.get("oversubscribe") is not True:
        return
    memory = limits["memory"] if "memory" in limits else (present or {}).get("memory_limit")
    if memory is None or memory == NONE_WORD:
        code = USAGE_ERROR if present is None else REFUSED
        fail(f"{flags.typed[gpu, 'oversubscribe']}: needs a memory limit; give --mem", code)


def _change_gpus(
    flags: Mapping[str, object],
    gpus: _GpuFlags,
    body: dict[str, object],
    pod: tuple[str, str] | None = None,
) -> Any:
    """A change of a pod's limits: its GPUs checked against the node's (and, for a pod that
    exists, against its limits), then the request: ``pod`` (namespace, name) changed, or None
    for a new pod."""

    def change(client: "Client") -> Any:
        present = client.pod(*pod) if pod is not None and gpus.named_by else None
        _on_this_node(client, gpus, present)
        if pod is None:
            return client.change("POST", f"{API}/pods", body=body)
        return client.change("PATCH", f"{API}/pods/{pod[0]}/{pod[1]}", body=body)

    return _call(flags, change)


def _change(
    flags: Mapping[str, object],
    method: str,
    path: str,
    explain: Callable[[str], str] = lambda message: message,
    **request: Any,
) -> Any:
    """A request that changes something: it carries the token."""
    return _call(flags, lambda c: c.change(method, path, **request), explain)


@pods_app.command("list")
@settings_flags(*CLIENT_SETTINGS)
def pods_list(
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Pods of every namespace.")
    ] = False,
    as_json: JsonFlag = False,
    form: OutputOption = None,
    watch: WatchOption = False,
) -> None:
    """Pods with their limits and usage per GPU, of one namespace (-n) or all (-A)."""
    if all_namespaces and namespace is not None:
        fail(f"--namespace {namespace} and --all-namespaces disagree: give one of them")
    if namespace is not None:
        check_pod_name("namespace", namespace, f"--namespace {namespace}")
    wanted = None if all_namespaces else namespace or "default"
    chosen = output.choose(form, as_json)
    _list(
        flags,
        lambda client: client.pods(wanted),
        chosen,
        "pods",
        watch=watch,
    )


@pods_app.command("get")
@settings_flags(*CLIENT_SETTINGS)
def pods_get(
    pod: PodArgument,
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    as_json: JsonFlag = False,
    form: OutputOption = None,
) -> None:
    """One pod: its limits and usage per GPU."""
    namespace, name = _pod_name(pod, namespace)
    document = _call(flags, lambda client: client.pod(namespace, name))
    output.show(document, output.choose(form, as_json), "pods")


@pods_app.command("describe")
@settings_flags(*CLIENT_SETTINGS)
def pods_describe(
    pod: PodArgument,
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    as_json: JsonFlag = False,
    form: DocumentOutputOption = None,
) -> None:
    """One pod in full: region, creation, limits and usage per GPU, and its workers."""
    from vgpu_hypervisor.client.describe import describe_pod

    namespace, name = _pod_name(pod, namespace)

    def both(client: "Client") -> dict[str, Any]:
        return client.pod(namespace, name) | {"worker_list": client.workers(namespace, name)}

    document = _call(flags, both)
    if not output.print_document(document, output.choose(form, as_json)):
        print(describe_pod(document), end="")


@pods_app.command("create")
@settings_flags(*CLIENT_SETTINGS)
def pods_create(
    pod: PodArgument,
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    mem: MemOption = None,
    compute: ComputeOption = None,
    oversubscribe: OversubscribeOption = None,
    burst: BurstOption = None,
    qos: QosOption = None,
    weight: WeightOption = None,
    owner: Annotated[
        str | None,
        typer.Option(
            "--owner",
            metavar="USER[:GROUP]",
            help="Who runs the pod's programs (name or id): its region is theirs, mode 0660. "
            "Default: the daemon's user.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonFlag = False,
    form: OutputOption = None,
) -> None:
    """Create a pod with memory and compute limits per GPU."""
    from vgpu_hypervisor.client.owner import pod_owner

    chosen = output.choose(form, as_json)
    namespace, name = _pod_name(pod, namespace)
    gpus = _gpu_limits(mem, compute, oversubscribe, burst=burst)
    for gpu, limits in gpus.gpus.items():  # a new pod has no compute limit of its own
        if _percent_of(limits.get("burst")) is not None and limits.get("compute") is None:
            fail(f"{gpus.typed[gpu, 'burst']}: a burst needs a compute limit; give --compute")
    body: dict[str, object] = {"namespace": namespace, "name": name, "gpus": gpus.gpus}
    body |= _policy(qos, weight)
    if owner is not None:
        body |= pod_owner(owner)
    document = _change_gpus(flags, gpus, body)
    output.show(document, chosen, "pods")


UPDATE_FLAGS = "--mem, --compute, --burst, --oversubscribe, --no-oversubscribe, --qos or --weight"


@pods_app.command("update")
@settings_flags(*CLIENT_SETTINGS)
def pods_update(
    pod: PodArgument,
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    mem: MemOption = None,
    compute: ComputeOption = None,
    oversubscribe: OversubscribeOption = None,
    no_oversubscribe: NoOversubscribeOption = None,
    burst: BurstOption = None,
    qos: QosOption = None,
    weight: WeightOption = None,
    as_json: JsonFlag = False,
    form: OutputOption = None,
) -> None:
    """Change a pod's limits, class or weight live (running workers follow within a second)."""
    chosen = output.choose(form, as_json)
    namespace, name = _pod_name(pod, namespace)
    policy = _policy(qos, weight)
    gpus = _gpu_limits(
        mem,
        compute,
        oversubscribe,
        no_oversubscribe,
        burst,
        required=None if policy else f"nothing to change: give one of {UPDATE_FLAGS}",
    )
    body: dict[str, object] = ({"gpus": gpus.gpus} if gpus.gpus else {}) | policy
    document = _change_gpus(flags, gpus, body, (namespace, name))
    output.show(document, chosen, "pods")


@pods_app.command("freeze")
@settings_flags(*CLIENT_SETTINGS)
def pods_freeze(
    pod: PodArgument,
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu", metavar="GPU", help="Freeze this GPU only (index or UUID).", show_default=False
        ),
    ] = None,
    as_json: JsonFlag = False,
    form: OutputOption = None,
) -> None:
    """Freeze a pod: its workers' next GPU launches wait until resume; memory stays. The daemon
    holds the freeze; 10 s after it stops, the pod runs again."""
    chosen = output.choose(form, as_json)
    namespace, name = _pod_name(pod, namespace)
    params = {"gpu": gpu} if gpu is not None else None
    named = _GpuFlags()
    if gpu is not None:
        named.set("--gpu", f"--gpu {gpu}", gpu, "freeze", True)

    def freeze(client: "Client") -> Any:
        _on_this_node(client, named)  # a GPU the node lacks is not one the pod lacks
        return client.change("POST", f"{API}/pods/{namespace}/{name}/freeze", params=params)

    document = _call(flags, freeze, lambda message: message.replace("gpu ", "--gpu ", 1))
    output.show(document, chosen, "pods")


@pods_app.command("resume")
@settings_flags(*CLIENT_SETTINGS)
def pods_resume(
    pod: PodArgument,
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    as_json: JsonFlag = False,
    form: OutputOption = None,
) -> None:
    """Resume a frozen pod: its waiting launches go on at once."""
    chosen = output.choose(form, as_json)
    namespace, name = _pod_name(pod, namespace)
    document = _change(flags, "POST", f"{API}/pods/{namespace}/{name}/resume")
    output.show(document, chosen, "pods")


@pods_app.command("delete")
@settings_flags(*CLIENT_SETTINGS)
def pods_delete(
    pod: PodArgument,
    *,
    flags: Mapping[str, object],
    namespace: NamespaceOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Delete even while workers run in it.")
    ] = False,
    as_json: JsonFlag = False,
    form: DeletedOutputOption = None,
) -> None:
    """Delete a pod (its region file); refused while its workers live, unless --force."""
    chosen = output.choose(form, as_json)
    namespace, name = _pod_name(pod, namespace)
    params = {"force": "true"} if force else None

    def explain(message: str) -> str:  # the API's "force" is this command's --force
        return message.replace("delete with force", "give --force")

    path = f"{API}/pods/{namespace}/{name}"
    document = _change(flags, "DELETE", path, explain, params=params)
    if chosen is output.Form.name:
        output.show(document, chosen, "pods")
    elif not output.print_document(document, chosen):
        print(f"deleted pod {namespace}/{name}")


# --- shm -------------------------------------------------------------------------------------


@shm_app.command("show")
@settings_flags("config_file", "shm_base_path")
def shm_show(
    pod: Annotated[
        str | None,
        typer.Argument(metavar="[[NAMESPACE/]NAME]", help="A pod under the base path."),
    ] = None,
    *,
    flags: Mapping[str, object],
    path: Annotated[
        Path | None,
        typer.Option("--path", metavar="FILE", help="A region file to read instead."),
    ] = None,
    as_json: JsonFlag = False,
    form: DocumentOutputOption = None,
) -> None:
    """A pod's region file: limits and usage per GPU and per process."""
    from vgpu_limiter import region as regions
    from vgpu_limiter.region_report import print_tables, region_report, resolve_path

    settings = _settings(flags)
    try:
        file = resolve_path(pod, path, settings.shm_base_path, os.environ)
        with regions.open_region(file, writable=False) as region:
            report = region_report(region)
    except (ValueError, regions.RegionError) as error:
        fail(str(error), REFUSED)
    if not output.print_document(report, output.choose(form, as_json)):
        print_tables(report)


app.add_typer(pods_app, name="pods")
app.add_typer(shm_app, name="shm")
app.add_typer(config_app, name="config")


def main() -> None:
    try:
        run_app(app, "tf-hypervisor")
    except BrokenPipeError:  # `tf-hypervisor pods list | head`
        sys.stderr.close()
