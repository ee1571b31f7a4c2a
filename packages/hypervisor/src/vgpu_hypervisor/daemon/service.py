"""`tf-hypervisor daemon`: the node daemon's life.

Start: logging, then the GPU backend (its description is the first log line), the API token,
the base path's lock (one daemon per base path), the pods already under the base path (adopted
as they are), the API server. Then three tasks under supervision, each logged and restarted
with back-off if it fails, never silently ended:
GPU sampling (every sample interval), pod passes (every second at most: reclaim dead workers,
record host pids, publish a new view) and the metrics file. SIGTERM or SIGINT stops the server
and the tasks and closes NVML; the region files stay as they are, so a restart loses nothing.
The process ends within STOP_GRACE_S of the signal whatever still runs, and at once on a second
one.

This is the one module that wires the cluster parts into the core: the pod source (kubernetes/,
which answers the node's ClusterPods), the device plugin and the API's TokenReview, each
imported only when the settings ask for it, so the core imports none and a bare-metal daemon
loads none of them.
"""

import asyncio
import contextlib
import errno
import functools
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final

import uvicorn
from vgpu_common.small_file import SmallFileError

from vgpu_hypervisor import package_version
from vgpu_hypervisor.daemon.api.app import create_app
from vgpu_hypervisor.daemon.api.auth import read_or_create_token
from vgpu_hypervisor.daemon.api.context import ApiContext
from vgpu_hypervisor.daemon.api.limits import server_config
from vgpu_hypervisor.daemon.api.token_review import TokenReviewer
from vgpu_hypervisor.daemon.boost_publisher import READ_INTERVAL_S, BoostPublisher
from vgpu_hypervisor.daemon.demand import FIRST_USE_WINDOW_NS
from vgpu_hypervisor.daemon.idle_settings import idle_settings
from vgpu_hypervisor.daemon.leases import (
    STRANGERS_EVERY_S,
    NewcomerWatch,
    StrangerWatch,
    start_lease_broker,
)
from vgpu_hypervisor.daemon.log_format import formatter
from vgpu_hypervisor.daemon.metrics import MetricsFile, SchedulerEvents, influx_lines
from vgpu_hypervisor.daemon.node import Node
from vgpu_hypervisor.daemon.pods import POLICY_FOLDER, PodStore
from vgpu_hypervisor.daemon.private_file import LockHeld, PrivateFile, PrivateFolderError
from vgpu_hypervisor.daemon.refusals import RefusalLog, RefusalReporter
from vgpu_hypervisor.extras import ExtraMissing, require_kubernetes
from vgpu_hypervisor.gpu import GpuBackendError, GpuObserver, NodeSnapshot
from vgpu_hypervisor.listen_address import TcpAddress, UnixAddress
from vgpu_hypervisor.settings import Settings

if TYPE_CHECKING:  # the device plugin (gRPC) and the pod source load only when they run
    from vgpu_limiter.lease_broker import LeaseBroker

    from vgpu_hypervisor.device_plugin.allocation import NodePods
    from vgpu_hypervisor.device_plugin.server import DevicePlugin
    from vgpu_hypervisor.dra.runner import DraRunning
    from vgpu_hypervisor.kubernetes.pod_source import PodSource

log = logging.getLogger("vgpu_hypervisor")
_POD_PASS_S = 1.0  # dead workers' memory comes back within two of these
_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
# From SIGTERM to exit at most; Kubernetes' default grace and the systemd unit's stop timeout
# are 30 s before they send SIGKILL.
STOP_GRACE_S: Final = 15.0
LOCK_FILE: Final = "lock"  # in the daemon's own folder of the base path: one daemon per base


class DaemonError(Exception):
    """The daemon cannot start; one line."""


def _os_error(error: OSError) -> str:
    """An OSError in words. mkdir(exist_ok=True) of a file says "File exists", which reads as
    if the folder were there: the base path or the log's folder was a file."""
    if isinstance(error, FileExistsError) and error.filename is not None:
        return f"{error.filename} is a file, not a folder"
    return str(error.strerror or error)


def setup_logging(settings: Settings) -> None:
    handler: logging.Handler
    if settings.log_path is not None:
        try:
            settings.log_path.parent.mkdir(parents=True, exist_ok=True)
            # 0640 when made: the log names every pod and its limit changes.
            os.close(os.open(settings.log_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o640))
            handler = logging.FileHandler(settings.log_path)
        except OSError as error:
            raise DaemonError(
                f"cannot open log file {settings.log_path}: {_os_error(error)}"
            ) from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(settings.log_format))
    root = logging.getLogger("vgpu_hypervisor")
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    root.propagate = False
    # uvicorn's own problems (a broken request, a failed startup) in the same file and format;
    # its start-up chatter stays out.
    server = logging.getLogger("uvicorn")
    server.handlers[:] = [handler]
    server.setLevel(max(logging.WARNING, root.level))
    server.propagate = False


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon stops it with everything else."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen_socket(settings: Settings) -> socket.socket:
    address = settings.api_listen_addr
    try:
        if isinstance(address, UnixAddress):
            address.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if address.path.is_socket():
                    address.path.unlink()  # left by a daemon that did not stop cleanly
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(address.path))
            address.path.chmod(0o660)
        else:
            assert isinstance(address, TcpAddress)
            infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
            family, kind, protocol, _, sockaddr = infos[0]
            # The protocol must say TCP: asyncio sets TCP_NODELAY on accepted sockets only
            # then, and without it every keep-alive reply waits ~40 ms for a delayed ACK.
            sock = socket.socket(family, kind, protocol or socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
    except OSError as error:
        raise DaemonError(f"cannot listen on {address}: {error.strerror or error}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _loopback_only(address: TcpAddress | UnixAddress) -> bool:
    """Only this host can connect: a unix socket, or a TCP address all of whose forms are
    loopback (a name such as localhost is resolved)."""
    if isinstance(address, UnixAddress):
        return True
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def _prepare_files(settings: Settings) -> str:
    """The API token (made when missing) and the base path of the regions; DaemonError."""
    try:
        token = read_or_create_token(settings.token_file)
    except OSError as error:
        raise DaemonError(
            f"cannot create the API token file {settings.token_file}: {error.strerror} "
            "(--token-file chooses another)"
        ) from None
    except SmallFileError as error:
        raise DaemonError(
            f"the API token file {settings.token_file}: {error} (--token-file chooses another)"
        ) from None
    try:
        settings.shm_base_path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DaemonError(
            f"cannot create the base path {settings.shm_base_path}: {_os_error(error)}"
        ) from None
    if settings.gpu_metrics_file is not None:
        # Opened once here: a metrics file that cannot be written (a folder, a read-only
        # place) was only logged at each write, while the daemon ran on without metrics. Not
        # waiting: a named pipe whose reader is not there yet is one (ENXIO), taken as it is.
        try:
            settings.gpu_metrics_file.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC
            os.close(os.open(settings.gpu_metrics_file, flags, 0o640))
        except OSError as error:
            if error.errno == errno.ENXIO:
                return token
            raise DaemonError(
                f"cannot open the metrics file {settings.gpu_metrics_file}: {_os_error(error)}"
            ) from None
    return token


def _lock_base(base: Path) -> int:
    """One daemon per base path: the descriptor of its lock, held until the daemon ends;
    DaemonError when another daemon holds it or the daemon's folder there is not its own.
    Before, a second daemon on the same base ran its passes over the same regions with limits
    held apart from the first one's: a raise the admin made through the first was set back by
    the second within a second, and both rewrote the same files in .daemon."""
    lock = PrivateFile(base / POLICY_FOLDER, LOCK_FILE)
    try:
        return lock.lock()
    except LockHeld as error:
        pid = f" (pid {error.holder})" if error.holder.isdigit() else ""
        raise DaemonError(
            f"another daemon{pid} serves the base path {base} (it holds {lock.path}): "
            "stop it first, or give this one another --shm-base-path"
        ) from None
    except PrivateFolderError as error:
        raise DaemonError(f"cannot lock the base path {base}: {error}") from None


def _follows_a_cluster(settings: Settings) -> bool:
    """Whether the daemon serves Kubernetes (its pods, or the kubelet's device plugin)."""
    from vgpu_hypervisor.kubernetes.setup import enabled  # the one wiring module; lazily

    return settings.device_plugin or settings.dra or enabled(settings)


class Daemon:
    def __init__(
        self,
        settings: Settings,
        *,
        listener: socket.socket | None = None,
        pending_pods: "NodePods | None" = None,
    ) -> None:
        """``pending_pods``: this node's pods from the API server, for the device plugin's
        bindings (the pod source gives them; without one Allocate says so)."""
        self.settings = settings
        self._listener = listener
        self._pending_pods = pending_pods
        self._plugin: DevicePlugin | None = None
        self._dra: DraRunning | None = None
        self._reviewer: TokenReviewer | None = None
        self._stop = asyncio.Event()
        self._failing: set[str] = set()
        self._signalled_once = False

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        settings = self.settings
        _check_extras(settings)
        simulate = settings.simulate
        cluster = _follows_a_cluster(settings)
        if simulate is None and cluster:
            # Never offer the kubelet GPUs that do not exist: on a node without the driver the
            # daemon stops, rather than falling back to the simulated GPU.
            simulate = False
        try:
            observer = GpuObserver.open(simulate=simulate, sim_state=settings.sim_state)
        except GpuBackendError as error:
            said = f"{error} (with --kubernetes or --device-plugin the simulated GPU runs only"
            raise DaemonError(f"{said} with --simulate)" if cluster else str(error)) from None
        with observer:
            log.info("%s", observer.backend.describe())
            if settings.sim_state is not None and observer.backend.backend != "simulated":
                # Given (--sim-state, VGPU_SIM_STATE) and never read on the driver: said, as
                # idle_settings says the others; it can be known only once the backend runs.
                log.warning(
                    "sim_state (%s) takes effect only with the simulated GPU, and the NVIDIA "
                    "driver runs: ignored",
                    settings.sim_state,
                )
            await self._serve(observer)

    async def _serve(self, observer: GpuObserver) -> None:
        """Serve with the node's device leases arbitrated, and stop arbitrating on every way out
        (a start that fails half-way included)."""
        token = _prepare_files(self.settings)
        lock = _lock_base(self.settings.shm_base_path)
        try:
            leases = start_lease_broker(
                self.settings.shm_base_path, observer.backend, self.settings.context_charge
            )
            try:
                await self._serve_with(observer, token, leases)
            finally:
                if leases is not None:
                    leases.close()
        finally:
            os.close(lock)

    async def _serve_with(
        self, observer: GpuObserver, token: str, leases: "LeaseBroker | None"
    ) -> None:
        settings = self.settings
        store = PodStore(settings.shm_base_path)
        publisher = None
        if settings.boost_correction:
            publisher = BoostPublisher(
                settings.shm_base_path, observer.backend.device_count, leases
            )
        node = Node(observer, store, publisher.boosts if publisher is not None else dict)
        await asyncio.to_thread(node.sample)
        view = await asyncio.to_thread(node.refresh)
        log.info(
            "base path %s: %d pod(s), %d worker(s)%s",
            settings.shm_base_path,
            len(view.pods),
            len(view.workers),
            "".join(f"; pod {p.namespace}/{p.name}: {p.error}" for p in view.pods if p.error),
        )
        source = await self._kubernetes(node)
        await self._start_cluster_parts(view.snapshot, store, source)
        if self._plugin is not None:
            node.committed = self._plugin.ledger.committed
        await self._start_dra(view.snapshot, observer, store)
        self._share_regions(source)
        context = ApiContext(
            node=node,
            backend=observer.backend,
            token=token,
            version=package_version(),
            shm_base_path=settings.shm_base_path,
            started=time.time(),
            running=lambda: not self._failing,
            reviewer=self._reviewer,
            open_reads=frozenset(settings.api_open_reads),
            cluster_problem=None if source is None else lambda: source.problem,
        )
        listener = self._listener or _listen_socket(settings)
        server = _Server(server_config(create_app(context)))
        self._catch_signals(asyncio.get_running_loop())
        tasks = [
            asyncio.create_task(self._supervise("GPU sampling", lambda: self._sampling(node))),
            asyncio.create_task(
                self._supervise("pod passes", lambda: self._pod_passes(node, leases))
            ),
            asyncio.create_task(server.serve(sockets=[listener])),
        ]
        if publisher is not None:
            tasks.append(
                asyncio.create_task(
                    self._supervise(
                        "boost correction", lambda: _every(READ_INTERVAL_S, publisher.tick)
                    )
                )
            )
        if leases is not None:
            strangers = StrangerWatch(leases)
            tasks.append(
                asyncio.create_task(
                    self._supervise(
                        "lease strangers", lambda: _every(STRANGERS_EVERY_S, strangers.tick)
                    )
                )
            )
        if source is not None:
            tasks.append(asyncio.create_task(self._supervise("Kubernetes pods", source.run)))
        if settings.gpu_metrics_file is not None:
            metrics = MetricsFile(settings.gpu_metrics_file, settings.metrics_rotate_bytes)
            tasks.append(
                asyncio.create_task(
                    self._supervise("metrics file", lambda: self._metrics(node, metrics))
                )
            )
        opened = ",".join(settings.api_open_reads)
        log.info(
            "API listening on %s; reads without the token: %s",
            settings.api_listen_addr,
            opened or "none",
        )
        if opened and not _loopback_only(settings.api_listen_addr):
            log.warning(
                "the API listens on %s, beyond this host, and answers reads of %s without a "
                "token (api_open_reads): anyone who reaches it sees them",
                settings.api_listen_addr,
                opened,
            )
        try:
            await self._stop.wait()
        finally:
            log.info("stopping")
            server.should_exit = True
            for task in tasks[:2] + tasks[3:]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if publisher is not None:
                publisher.close()
            listener.close()
            if isinstance(settings.api_listen_addr, UnixAddress):
                settings.api_listen_addr.path.unlink(missing_ok=True)
            await self._stop_cluster_parts()
            store.close()
            log.info("stopped")

    async def _kubernetes(self, node: Node) -> "PodSource | None":
        """The pod source when the daemon follows Kubernetes (imported only then)."""
        from vgpu_hypervisor.kubernetes import setup
        from vgpu_hypervisor.kubernetes.identity import CgroupPods

        if not setup.enabled(self.settings):
            # Refusals go to the log; in a cluster, to the pods' events (setup.pod_source).
            node.watchers.append(RefusalReporter(RefusalLog()).observe)
            return None
        try:
            source = setup.pod_source(self.settings, node)
        except setup.KubernetesSetupError as error:
            raise DaemonError(str(error)) from None
        log.info("Kubernetes: following the pods of node %s", source.node_name)
        node.cluster = CgroupPods(source)
        return source

    async def _stop_cluster_parts(self) -> None:
        if self._plugin is not None:
            await asyncio.to_thread(self._plugin.stop)
        if self._dra is not None:
            await asyncio.to_thread(self._dra.stop)
        if self._reviewer is not None:
            self._reviewer.close()

    async def _start_cluster_parts(
        self, snapshot: NodeSnapshot | None, store: PodStore, source: "PodSource | None"
    ) -> None:
        """TokenReview and the device plugin, where the settings ask for them. With the pod
        source, an allocation bound to its pod (the kubelet's PodResources) finds the pod among
        the source's pods and the source sets the pod's limits (annotations and resources) on
        the GPUs Allocate gave."""
        settings = self.settings
        self._reviewer = _token_reviewer(settings)
        if not settings.device_plugin or snapshot is None:
            return
        pods = source.pods if source is not None else self._pending_pods
        assign = source.assign if source is not None else None
        live = source.live_uids if source is not None else None
        events = source.events if source is not None else None
        from vgpu_hypervisor.device_plugin.resources import ResourceError
        from vgpu_hypervisor.device_plugin.runner import build_plugin

        try:
            self._plugin = build_plugin(
                settings,
                snapshot,
                store,
                pods,
                assign,
                live=live,
                events=None if events is None else events.post,
            )
            await asyncio.to_thread(self._plugin.start)
        except (ResourceError, OSError, RuntimeError) as error:  # RuntimeError: gRPC's bind
            raise DaemonError(f"device plugin: {error}") from None
        log.info("device plugin serving in %s", settings.device_plugin_dir)

    def _share_regions(self, source: "PodSource | None") -> None:
        """Before the pod source's first list (pod_source.share_regions)."""
        if source is not None:
            from vgpu_hypervisor.kubernetes.pod_source import share_regions

            share_regions(
                source,
                None if self._plugin is None else self._plugin.assigned,
                None if self._dra is None else self._dra.driver.preparer,
            )

    async def _start_dra(
        self, snapshot: NodeSnapshot | None, observer: GpuObserver, store: PodStore
    ) -> None:
        """The DRA driver and the node's ResourceSlice, where --dra asks for them."""
        if not self.settings.dra or snapshot is None:
            return
        from vgpu_hypervisor.dra.kube import KubeError
        from vgpu_hypervisor.dra.runner import build_driver

        try:
            self._dra = build_driver(self.settings, snapshot, observer.backend, store)
            await asyncio.to_thread(self._dra.start, snapshot)
        except (KubeError, OSError, RuntimeError) as error:  # RuntimeError: gRPC's bind
            raise DaemonError(f"DRA driver: {error}") from None
        log.info("DRA driver serving in %s", self.settings.dra_plugins_dir)

    def _catch_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            # A plain handler rather than the loop's: Python runs it in the main thread even
            # while the loop is held up (a lock, a system call), so the deadline always starts.
            with contextlib.suppress(ValueError):  # not the main thread: the caller stops us
                signal.signal(signum, functools.partial(self._on_signal, loop))

    def _on_signal(
        self, loop: asyncio.AbstractEventLoop, signum: int, frame: FrameType | None
    ) -> None:
        name = signal.Signals(signum).name
        if self._signalled_once:
            exit_now(f"{name} received again")
        self._signalled_once = True
        exit_after(STOP_GRACE_S)
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is ending
            loop.call_soon_threadsafe(self._signalled, signum)

    def _signalled(self, signum: int) -> None:
        log.info("%s received", signal.Signals(signum).name)
        self.stop()

    async def _supervise(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` for ever; a failure is logged and the task restarted after a pause."""
        failures = 0
        while True:
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception as error:
                pause = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
                failures += 1
                self._failing.add(name)
                log.error(
                    "%s failed: %s: %s; restarting in %g s",
                    name,
                    type(error).__name__,
                    error,
                    pause,
                )
                log.debug("%s failure", name, exc_info=True)
                await asyncio.sleep(pause)
                self._failing.discard(name)

    async def _sampling(self, node: Node) -> None:
        # A GPU the sample lost becomes Unhealthy to the kubelet and leaves the ResourceSlice.
        parts = [part for part in (self._plugin, self._dra) if part is not None]

        def sample() -> None:
            snapshot = node.sample()
            for part in parts:
                part.update_health(snapshot)

        await _every(self.settings.sample_interval_s, sample)

    async def _pod_passes(self, node: Node, leases: "LeaseBroker | None") -> None:
        # Sooner while a pod that started to want a GPU waits for its use to be measured, and
        # once a pod woke beside bursting ones (held to their hard limits until a pass).
        sooner = FIRST_USE_WINDOW_NS / 1e9
        newcomers = NewcomerWatch(leases) if leases is not None else None

        def when() -> float | None:
            if newcomers is not None and newcomers.pass_due():
                return 0.0
            return sooner if node.measuring else None

        await _every(min(self.settings.sample_interval_s, _POD_PASS_S), node.refresh, when)

    async def _metrics(self, node: Node, metrics: MetricsFile) -> None:
        events = SchedulerEvents()
        await _every(
            self.settings.sample_interval_s,
            lambda: metrics.write(influx_lines(node.view) + events.lines(node.view)),
        )


def exit_after(grace_s: float) -> None:
    """End the process ``grace_s`` seconds from now unless it has ended. A worker thread stuck
    in a system call (a driver that stopped answering, an open that waits for a peer) cannot be
    cancelled, and both asyncio.run's shutdown of its executor and the interpreter's exit wait
    for such threads for ever: without a deadline the daemon ignores SIGTERM until SIGKILL."""

    def expire() -> None:
        time.sleep(grace_s)
        exit_now(f"still stopping {grace_s:g} s after the signal")

    threading.Thread(target=expire, name="stop-deadline", daemon=True).start()


def exit_now(why: str) -> None:
    """Log which threads are still running, flush the log and end the process (status 1)."""
    current = threading.current_thread()
    running = sorted(t.name for t in threading.enumerate() if t is not current and not t.daemon)
    log.error("%s: exiting without the threads still running (%s)", why, ", ".join(running))
    for handler in logging.getLogger("vgpu_hypervisor").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(1)


def _check_extras(settings: Settings) -> None:
    """DaemonError, before anything starts, when a part asked for lacks its extra."""
    from vgpu_hypervisor.kubernetes import setup

    try:
        if setup.enabled(settings):
            explicit = settings.kubernetes is not None
            require_kubernetes("--kubernetes" if explicit else "the pod source (in a cluster)")
        if settings.device_plugin:
            require_kubernetes("--device-plugin")
        if settings.dra:
            require_kubernetes("--dra")
        if settings.token_review:
            require_kubernetes("--token-review")
    except ExtraMissing as error:
        raise DaemonError(str(error)) from None


def _token_reviewer(settings: Settings) -> TokenReviewer | None:
    """Kubernetes' TokenReview (lightkube: imported only when --token-review is on)."""
    if not settings.token_review:
        return None
    from vgpu_hypervisor.kubernetes import token_review

    url = settings.token_review_url or token_review.in_cluster_url()
    if url is None:
        raise DaemonError(
            "--token-review: KUBERNETES_SERVICE_HOST is unset (not in a cluster); "
            "give --token-review-url"
        )
    return token_review.TokenReviewer(url, settings.token_review_allow)


_SOONER_CHECK_S = 0.05  # how often a wait for the next run asks ``sooner`` again


async def _every(
    period: float, work: Callable[[], object], sooner: Callable[[], float | None] | None = None
) -> None:
    """``work`` in a worker thread every ``period`` seconds (a slow run delays the next), or
    that long after the last run when ``sooner`` says less: asked again while waiting, since
    something else (an API request's pass) may have made it say so."""
    loop = asyncio.get_running_loop()
    deadline = loop.time()
    while True:
        await asyncio.to_thread(work)
        ran = loop.time()
        deadline = max(deadline + period, ran)
        while (now := loop.time()) < deadline:
            wanted = sooner() if sooner is not None else None
            if wanted is not None and ran + wanted <= now:
                deadline = now
                break
            wait = deadline - now if sooner is None else min(deadline - now, _SOONER_CHECK_S)
            await asyncio.sleep(wait)


def run(
    settings: Settings, warnings: Iterable[str] = (), sources: Mapping[str, str] | None = None
) -> None:
    """Run the daemon until SIGTERM/SIGINT; DaemonError when it cannot start. ``warnings``:
    what reading the settings found (a misspelled variable), logged first; ``sources``: where
    each setting came from, so that one given that nothing reads is said too."""
    from vgpu_hypervisor.kubernetes.setup import enabled  # the one wiring module; lazily

    setup_logging(settings)
    for warning in warnings:
        log.warning("%s", warning)
    for line in idle_settings(settings, sources or {}, pod_source=enabled(settings)):
        log.warning("%s", line)
    asyncio.run(Daemon(settings).run())
