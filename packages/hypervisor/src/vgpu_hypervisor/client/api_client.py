"""The CLI's HTTP client: finds the daemon and its token through the daemon's own settings
(`--listen` / `API_LISTEN_ADDR`, `--token-file`), and turns every failure into one line.

Changes always carry the token. Reads carry it when the token file can be read (the admin on
the node), and go without it otherwise: a daemon whose api_open_reads opens them answers, one
that does not answers 401, which the error then explains."""

import http.client
import json
import socket
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from vgpu_hypervisor.listen_address import TcpAddress, UnixAddress
from vgpu_hypervisor.settings import Settings

API = "/api/v1"


class ClientError(Exception):
    """A request that failed; str() is one line."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the daemon's unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("tf-hypervisor", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _connection(address: TcpAddress | UnixAddress, timeout: float) -> http.client.HTTPConnection:
    if isinstance(address, UnixAddress):
        return _UnixConnection(str(address.path), timeout)
    host = address.host
    if host in ("0.0.0.0", "::"):  # listening everywhere: this machine answers on loopback
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return http.client.HTTPConnection(host, address.port, timeout=timeout)


class Client:
    """The daemon's API over one kept-alive connection (the standard library's http.client:
    a CLI call starts in a fraction of the time an HTTP library with its own stack takes)."""

    def __init__(self, settings: Settings, *, timeout: float = 10.0) -> None:
        self.address = settings.api_listen_addr
        self.token_file: Path = settings.token_file
        self._http = _connection(self.address, timeout)

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
            token = self.token_file.read_text().strip()
        except OSError as error:
            raise ClientError(
                f"cannot read the API token {self.token_file}: {error.strerror} "
                "(run as the daemon's user, or give --token-file)"
            ) from None
        if not token:
            raise ClientError(f"the API token file {self.token_file} is empty")
        return token

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
        target = f"{path}?{urlencode(params)}" if params else path
        try:
            try:
                status, content_type, text = self._exchange(method, target, payload, headers)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if method != "GET":
                    raise
                # The daemon closes idle kept-alive connections (top between refreshes): a read
                # is safe to send again, once, on a new connection.
                self._http.close()
                status, content_type, text = self._exchange(method, target, payload, headers)
        except (ConnectionRefusedError, FileNotFoundError, socket.gaierror) as error:
            self._http.close()
            raise ClientError(
                f"cannot reach the daemon at {self.address}: {_reason(error)} "
                "(is `tf-hypervisor daemon` running? --listen or API_LISTEN_ADDR says where)"
            ) from None
        except TimeoutError:
            self._http.close()
            raise ClientError(f"the daemon at {self.address} did not answer in time") from None
        except (OSError, http.client.HTTPException) as error:
            self._http.close()
            raise ClientError(f"request to {self.address} failed: {_reason(error)}") from None
        if 200 <= status < 300:
            return json.loads(text) if content_type.startswith("application/json") else text
        try:
            message = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            message = text.strip().splitlines()[0] if text.strip() else ""
        message = message or f"the daemon answered {status}"
        if status == 401 and no_token is not None:
            message = f"{message} ({no_token})"
        raise ClientError(message)

    def _exchange(
        self, method: str, target: str, payload: bytes | None, headers: dict[str, str]
    ) -> tuple[int, str, str]:
        self._http.request(method, target, body=payload, headers=headers)
        reply = self._http.getresponse()
        content_type = reply.getheader("Content-Type", "") or ""
        return reply.status, content_type, reply.read().decode(errors="replace")

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v})


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
