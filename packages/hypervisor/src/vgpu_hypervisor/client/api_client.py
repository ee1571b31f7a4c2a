"""The CLI's HTTP client: finds the daemon and its token through the daemon's own settings
(`--listen` / `API_LISTEN_ADDR`, `--token-file`), and turns every failure into one line.

Changes always carry the token. Reads carry it when the token file can be read (the admin on
the node), and go without it otherwise: a daemon whose api_open_reads opens them answers, one
that does not answers 401, which the error then explains.

httpx, the one HTTP client of the project's Python side (the tests speak it too), over the
daemon's unix socket or TCP, one kept-alive connection for a command's requests.

Each reply is checked here, once, against the document models.py says the route answers:
what the commands and `top` then read is that document. Another service on the port, or a
daemon of another version that answers otherwise, is a ClientError naming the first field
that differs, where it was a KeyError or AttributeError traceback in whatever read it first
(and `pods delete` said it had deleted a pod on `{"a": 1}`). Fields the models do not know
are let through: a newer daemon may add some."""

import json
import socket
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import httpx
from pydantic import TypeAdapter, ValidationError
from vgpu_common.small_file import TOKEN_LIMIT, SmallFileError, read_small_file, token_of
from vgpu_common.visible import visible

from vgpu_hypervisor import models
from vgpu_hypervisor.listen_address import TcpAddress, UnixAddress
from vgpu_hypervisor.settings import Settings

API = "/api/v1"

# What each route answers.
_STATUS: Final = TypeAdapter(models.Status)
_GPUS: Final = TypeAdapter(list[models.Gpu])
_POD: Final = TypeAdapter(models.Pod)  # also every change's answer: the pod as it is now
_PODS: Final = TypeAdapter(list[models.Pod])
_WORKERS: Final = TypeAdapter(list[models.Worker])


class ClientError(Exception):
    """A request that failed; str() is one line."""


def _http(address: TcpAddress | UnixAddress, timeout: float) -> httpx.Client:
    # Plain HTTP to this host: trust_env off (never the user's HTTP_PROXY), and no certificates
    # loaded (verify off: nothing here speaks TLS; loading certifi's cost a command 0.16 s).
    options: dict[str, Any] = {"timeout": timeout, "trust_env": False}
    if isinstance(address, UnixAddress):
        transport = httpx.HTTPTransport(uds=str(address.path), verify=False)
        return httpx.Client(base_url="http://tf-hypervisor", transport=transport, **options)
    host = address.host
    if host in ("0.0.0.0", "::"):  # listening everywhere: this machine answers on loopback
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    shown = f"[{host}]" if ":" in host else host
    return httpx.Client(base_url=f"http://{shown}:{address.port}", verify=False, **options)


class Client:
    """The daemon's API over one kept-alive connection."""

    def __init__(self, settings: Settings, *, timeout: float = 10.0) -> None:
        self.address = settings.api_listen_addr
        self.token_file: Path = settings.token_file
        self._http = _http(self.address, timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _token(self) -> str:
        try:
            return token_of(read_small_file(self.token_file, TOKEN_LIMIT))
        except OSError as error:
            raise ClientError(
                f"cannot read the API token {self.token_file}: {error.strerror} "
                "(run as the daemon's user, or give --token-file)"
            ) from None
        except SmallFileError as error:
            raise ClientError(f"the API token file {self.token_file}: {error}") from None

    def _read_headers(self) -> tuple[dict[str, str], str | None]:
        """A read's headers, and why they carry no token (None: they carry it)."""
        try:
            return {"Authorization": f"Bearer {self._token()}"}, None
        except ClientError as error:
            return {}, str(error)

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = self._request("GET", f"{API}/status", _STATUS)
        return document

    def gpus(self, *, authorized: bool = False) -> list[dict[str, Any]]:
        """``authorized``: asked for a change, which needs the token anyway."""
        gpus: list[dict[str, Any]] = self._request(
            "GET", f"{API}/gpus", _GPUS, authorized=authorized
        )
        return gpus

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The pods of ``namespace``, or of every namespace."""
        params = {"namespace": namespace} if namespace else None
        pods: list[dict[str, Any]] = self._request("GET", f"{API}/pods", _PODS, params=params)
        return pods

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self._request("GET", f"{API}/pods/{namespace}/{name}", _POD)
        return pod

    def workers(self, namespace: str | None = None, pod: str | None = None) -> list[dict[str, Any]]:
        """The workers of every pod, of a namespace's, or of one pod's."""
        given = {"namespace": namespace, "pod": pod}
        params = {key: value for key, value in given.items() if value} or None
        workers: list[dict[str, Any]] = self._request(
            "GET", f"{API}/workers", _WORKERS, params=params
        )
        return workers

    def change(
        self, method: str, path: str, *, body: Any = None, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A change of a pod (create, update, freeze, resume, delete), with the token: the pod's
        document the daemon answers."""
        pod: dict[str, Any] = self._request(
            method, path, _POD, body=body, params=params, authorized=True
        )
        return pod

    def _request(
        self,
        method: str,
        path: str,
        shape: TypeAdapter[Any],
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        authorized: bool = False,
    ) -> Any:
        """The JSON reply, checked to be a document of ``shape``; ClientError on any failure.
        ``authorized``: the request needs the token (a change); else it carries it if it can."""
        if authorized:
            headers, no_token = {"Authorization": f"Bearer {self._token()}"}, None
        else:
            headers, no_token = self._read_headers()
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = self._http.build_request(
            method, path, content=payload, headers=headers, params=params or None
        )
        reply = self._send(request)
        status, text = reply.status_code, reply.text
        if 200 <= status < 300:
            content_type = reply.headers.get("Content-Type", "")
            if content_type.startswith("application/json"):
                try:
                    document = json.loads(text)
                except (ValueError, RecursionError):
                    pass
                else:
                    return self._checked(request, document, shape)
            # Every /api/ route of the daemon answers JSON: something else listens there.
            raise ClientError(
                f"{self.address} is not a tf-hypervisor API: {request.url.path} answered "
                f"{content_type.split(';')[0] or 'no content type'}"
                f"{' that is not JSON' if content_type.startswith('application/json') else ''}"
                " (--listen or API_LISTEN_ADDR says where the daemon is)"
            )
        try:
            message = json.loads(text)["error"]
            if not isinstance(message, str):
                raise TypeError(message)
        except (ValueError, KeyError, TypeError):
            first = text.strip().splitlines()[0][:80] if text.strip() else ""
            message = f"{self.address} answered {status}" + (
                f" ({first}): not a tf-hypervisor reply" if first else ""
            )
        # One line, and shown as the daemon's log shows it: the message may name what a
        # tenant wrote (a region's UUID), or come from whatever else answers on the port.
        message = visible(" ".join(message.split())) or f"the daemon answered {status}"
        if status == 401 and no_token is not None:
            message = f"{message} ({no_token})"
        raise ClientError(message)

    def _checked(self, request: httpx.Request, document: Any, shape: TypeAdapter[Any]) -> Any:
        """``document`` if it is one of ``shape`` (its types strictly: "3" is no count; fields
        it does not know are let through); else a ClientError naming what differs."""
        try:
            shape.validate_python(document, strict=True, extra="ignore")
        except ValidationError as error:
            where = str(request.url.copy_with(query=None))
            if isinstance(self.address, UnixAddress):  # no host: the socket, then the path
                where = f"{self.address} {request.url.path}"
            problem = models.first_problem(error.errors(), "the document")
            raise ClientError(
                f"{where} answered a document that is not tf-hypervisor's: {visible(problem)}"
            ) from None
        return document

    def _send(self, request: httpx.Request) -> httpx.Response:
        """The reply, read whole; every transport failure a ClientError of one line."""
        try:
            try:
                return self._http.send(request)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                if request.method != "GET":
                    raise
                # The daemon closes idle kept-alive connections (top between refreshes): a read
                # is safe to send again, once, on a new connection.
                return self._http.send(request)
        except httpx.ConnectError as error:
            cause = _cause(error)
            if isinstance(cause, ConnectionRefusedError | FileNotFoundError | socket.gaierror):
                raise ClientError(
                    f"cannot reach the daemon at {self.address}: {_reason(error)} "
                    "(is `tf-hypervisor daemon` running? --listen or API_LISTEN_ADDR says where)"
                ) from None
            raise ClientError(f"request to {self.address} failed: {_reason(error)}") from None
        except httpx.TimeoutException:
            raise ClientError(f"the daemon at {self.address} did not answer in time") from None
        except httpx.HTTPError as error:
            raise ClientError(f"request to {self.address} failed: {_reason(error)}") from None


def _cause(error: BaseException) -> BaseException:
    """The OSError of the socket that httpx wrapped, else ``error`` itself."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return error


def _reason(error: BaseException) -> str:
    cause = _cause(error)
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return " ".join(str(cause).split()) or type(cause).__name__
