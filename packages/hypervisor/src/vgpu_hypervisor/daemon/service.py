"""`tf-hypervisor daemon`: the node daemon's life.

Start: logging, then the GPU backend (its description is the first log line), the API token,
the pods already under the base path (adopted as they are), the API server. Then three tasks
under supervision, each logged and restarted with back-off if it fails, never silently ended:
GPU sampling (every sample interval), pod passes (every second at most: reclaim dead workers,
record host pids, publish a new view) and the metrics file. SIGTERM or SIGINT stops the server
and the tasks and closes NVML; the region files stay as they are, so a restart loses nothing.
"""

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

import uvicorn

from vgpu_hypervisor import package_version
from vgpu_hypervisor.daemon.api.app import create_app
from vgpu_hypervisor.daemon.api.auth import read_or_create_token
from vgpu_hypervisor.daemon.api.context import ApiContext
from vgpu_hypervisor.daemon.api.limits import server_config
from vgpu_hypervisor.daemon.boost_publisher import READ_INTERVAL_S, BoostPublisher
from vgpu_hypervisor.daemon.metrics import MetricsFile, SchedulerEvents, influx_lines
from vgpu_hypervisor.daemon.node import Node
from vgpu_hypervisor.daemon.pods import PodStore
from vgpu_hypervisor.gpu import GpuBackendError, GpuObserver
from vgpu_hypervisor.listen_address import TcpAddress, UnixAddress
from vgpu_hypervisor.settings import Settings

log = logging.getLogger("vgpu_hypervisor")
_POD_PASS_S = 1.0  # dead workers' memory comes back within two of these
_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


class DaemonError(Exception):
    """The daemon cannot start; one line."""


def setup_logging(settings: Settings) -> None:
    handler: logging.Handler
    if settings.log_path is not None:
        try:
            settings.log_path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(settings.log_path)
        except OSError as error:
            raise DaemonError(
                f"cannot open log file {settings.log_path}: {error.strerror}"
            ) from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
    )
    root = logging.getLogger("vgpu_hypervisor")
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    root.propagate = False


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


class Daemon:
    def __init__(self, settings: Settings, *, listener: socket.socket | None = None) -> None:
        self.settings = settings
        self._listener = listener
        self._stop = asyncio.Event()
        self._failing: set[str] = set()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        settings = self.settings
        try:
            observer = GpuObserver.open(simulate=settings.simulate, sim_state=settings.sim_state)
        except GpuBackendError as error:
            raise DaemonError(str(error)) from None
        with observer:
            log.info("%s", observer.backend.describe())
            await self._serve(observer)

    async def _serve(self, observer: GpuObserver) -> None:
        settings = self.settings
        try:
            token = read_or_create_token(settings.token_file)
        except OSError as error:
            raise DaemonError(
                f"cannot create the API token file {settings.token_file}: {error.strerror} "
                "(--token-file chooses another)"
            ) from None
        try:
            settings.shm_base_path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DaemonError(
                f"cannot create the base path {settings.shm_base_path}: {error.strerror}"
            ) from None
        store = PodStore(settings.shm_base_path)
        publisher = None
        if settings.boost_correction:
            publisher = BoostPublisher(settings.shm_base_path, observer.backend.device_count)
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
        context = ApiContext(
            node=node,
            backend=observer.backend,
            token=token,
            version=package_version(),
            shm_base_path=settings.shm_base_path,
            started=time.time(),
            running=lambda: not self._failing,
        )
        listener = self._listener or _listen_socket(settings)
        server = _Server(server_config(create_app(context)))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self._signalled, signum)
        tasks = [
            asyncio.create_task(self._supervise("GPU sampling", lambda: self._sampling(node))),
            asyncio.create_task(self._supervise("pod passes", lambda: self._pod_passes(node))),
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
        if settings.gpu_metrics_file is not None:
            metrics = MetricsFile(settings.gpu_metrics_file, settings.metrics_rotate_bytes)
            tasks.append(
                asyncio.create_task(
                    self._supervise("metrics file", lambda: self._metrics(node, metrics))
                )
            )
        log.info("API listening on %s", settings.api_listen_addr)
        if not _loopback_only(settings.api_listen_addr):
            log.warning(
                "the API listens on %s, beyond this host: reads need no token, and they show "
                "every worker's command line (listen on 127.0.0.1 or a unix socket to keep "
                "them on the node)",
                settings.api_listen_addr,
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
            store.close()
            log.info("stopped")

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
        await _every(self.settings.sample_interval_s, node.sample)

    async def _pod_passes(self, node: Node) -> None:
        await _every(min(self.settings.sample_interval_s, _POD_PASS_S), node.refresh)

    async def _metrics(self, node: Node, metrics: MetricsFile) -> None:
        events = SchedulerEvents()
        await _every(
            self.settings.sample_interval_s,
            lambda: metrics.write(influx_lines(node.view) + events.lines(node.view)),
        )


async def _every(period: float, work: Callable[[], object]) -> None:
    """``work`` in a worker thread every ``period`` seconds (a slow run delays the next)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time()
    while True:
        await asyncio.to_thread(work)
        deadline = max(deadline + period, loop.time())
        await asyncio.sleep(deadline - loop.time())


def run(settings: Settings) -> None:
    """Run the daemon until SIGTERM/SIGINT; DaemonError when it cannot start."""
    setup_logging(settings)
    asyncio.run(Daemon(settings).run())
