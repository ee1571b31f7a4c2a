"""The CLI's HTTP client: finds the daemon and its token through the daemon's own settings
(`--listen` / `API_LISTEN_ADDR`, `--token-file`), and turns every failure into one line.

Changes always carry the token. Reads carry it when the token file can be read (the admin on
the node), and go without it otherwise: a daemon whose api_open_reads opens them answers, one
that does not answers 401, which the error then explains.

httpx, the one HTTP client of the project's Python side (the tests speak it too), over the
daemon's unix socket or TCP, one kept-alive connection for a command's requests."""

import json
import socket
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from vgpu_common.small_file import TOKEN_LIMIT, SmallFileError, read_small_file, token_of

from vgpu_hypervisor.listen_address import TcpAddress, UnixAddress
from vgpu_hypervisor.settings import Settings

API = "/api/v1"


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

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        authorized: bool = False,
    ) -> Any:
        """The decoded JSON reply (text for non-JSON replies); ClientError on any failure.
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
                    return json.loads(text)
                except ValueError:
                    pass
            elif not request.url.path.startswith("/api/"):
                return text  # /metrics
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
        message = message or f"the daemon answered {status}"
        if status == 401 and no_token is not None:
            message = f"{message} ({no_token})"
        raise ClientError(message)

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

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v})


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
