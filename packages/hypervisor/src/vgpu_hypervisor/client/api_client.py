"""The CLI's HTTP client: finds the daemon and its token through the daemon's own settings
(`--listen` / `API_LISTEN_ADDR`, `--token-file`), and turns every failure into one line."""

from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from vgpu_hypervisor.listen_address import TcpAddress, UnixAddress
from vgpu_hypervisor.settings import Settings

API = "/api/v1"


class ClientError(Exception):
    """A request that failed; str() is one line."""


def _base_url(address: TcpAddress | UnixAddress) -> str:
    if isinstance(address, UnixAddress):
        return "http://tf-hypervisor"
    host = address.host
    if host in ("0.0.0.0", "::"):  # listening everywhere: this machine answers on loopback
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{address.port}"


class Client:
    def __init__(self, settings: Settings, *, timeout: float = 10.0) -> None:
        self.address = settings.api_listen_addr
        self.token_file: Path = settings.token_file
        transport = (
            httpx.HTTPTransport(uds=str(self.address.path))
            if isinstance(self.address, UnixAddress)
            else None
        )
        self._http = httpx.Client(
            base_url=_base_url(self.address), transport=transport, timeout=timeout
        )

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

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        authorized: bool = False,
    ) -> Any:
        """The decoded JSON reply (text for non-JSON replies); ClientError on any failure."""
        headers = {"Authorization": f"Bearer {self._token()}"} if authorized else {}
        try:
            reply = self._http.request(method, path, json=body, params=params, headers=headers)
        except httpx.ConnectError as error:
            raise ClientError(
                f"cannot reach the daemon at {self.address}: {_reason(error)} "
                "(is `tf-hypervisor daemon` running? --listen or API_LISTEN_ADDR says where)"
            ) from None
        except httpx.TimeoutException:
            raise ClientError(f"the daemon at {self.address} did not answer in time") from None
        except httpx.HTTPError as error:
            raise ClientError(f"request to {self.address} failed: {_reason(error)}") from None
        if reply.is_success:
            if reply.headers.get("content-type", "").startswith("application/json"):
                return reply.json()
            return reply.text
        try:
            message = reply.json()["error"]
        except (ValueError, KeyError, TypeError):
            message = reply.text.strip().splitlines()[0] if reply.text.strip() else ""
        raise ClientError(message or f"the daemon answered {reply.status_code}")

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v})


def _reason(error: httpx.HTTPError) -> str:
    text = str(error) or type(error).__name__
    return text.split("] ", 1)[-1] if text.startswith("[Errno") else text
