"""A small API server for the DRA driver's tests: the REST paths and verbs the driver's client
uses (get, list with field selectors, create, replace, delete) for pods, ResourceClaims and
ResourceSlices, over real HTTP. Every object written is validated against the Kubernetes 1.34
published schema (kubernetes-validate, strict); an invalid one is refused with 422, as the
API server refuses it.
"""

import itertools
import json
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

SCHEMA_VERSION = "1.34.0"
_KINDS = {"pods": "Pod", "resourceclaims": "ResourceClaim", "resourceslices": "ResourceSlice"}


class Store:
    """Objects by their collection path and name."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.lock = threading.Lock()
        self._versions = itertools.count(1)

    def put(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Write ``obj`` (validated; new metadata where it is new)."""
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        meta = obj.setdefault("metadata", {})
        with self.lock:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            meta["resourceVersion"] = str(next(self._versions))
            self.objects[(collection, meta["name"])] = obj
        return obj

    def of(self, collection: str) -> list[dict[str, Any]]:
        with self.lock:
            return [obj for (where, _), obj in self.objects.items() if where == collection]


def _split(path: str) -> tuple[str, str | None, str]:
    """(collection path, object name or None, resource) of a request path."""
    parts = path.strip("/").split("/")
    plural_at = max(at for at, part in enumerate(parts) if part in _KINDS)
    name = parts[plural_at + 1] if plural_at + 1 < len(parts) else None
    return "/" + "/".join(parts[: plural_at + 1]), name, parts[plural_at]


def _selected(obj: Mapping[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        field, _, wanted = term.partition("=")
        value: Any = obj
        for key in field.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        if str(value) != wanted:
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    store: Store

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: HTTPStatus, message: str) -> None:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
        self._send(code, body | {"message": message, "reason": code.phrase, "code": code})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length", 0))
        body: dict[str, Any] = json.loads(self.rfile.read(length))
        return body

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        collection, name, plural = _split(url.path)
        if name is not None:
            found = self.store.objects.get((collection, name))
            if found is None:
                self._status(HTTPStatus.NOT_FOUND, f'{plural} "{name}" not found')
            else:
                self._send(HTTPStatus.OK, found)
            return
        selector = parse_qs(url.query).get("fieldSelector", [""])[0]
        items = [obj for obj in self.store.of(collection) if _selected(obj, selector)]
        kind = _KINDS[plural] + "List"
        metadata = {"resourceVersion": "1"}
        self._send(HTTPStatus.OK, {"kind": kind, "apiVersion": "v1", "metadata": metadata,
                                   "items": items})  # fmt: skip

    def _write(self, obj: dict[str, Any], collection: str, plural: str, created: bool) -> None:
        try:
            written = self.store.put(collection, obj)
        except kubernetes_validate.ValidationError as error:
            self._status(HTTPStatus.UNPROCESSABLE_ENTITY, f"{_KINDS[plural]}: {error.message}")
            return
        self._send(HTTPStatus.CREATED if created else HTTPStatus.OK, written)

    def do_POST(self) -> None:
        collection, _, plural = _split(urlsplit(self.path).path)
        obj = self._body()
        name = obj.get("metadata", {}).get("name")
        if (collection, name) in self.store.objects:
            self._status(HTTPStatus.CONFLICT, f'{plural} "{name}" already exists')
            return
        self._write(obj, collection, plural, created=True)

    def do_PUT(self) -> None:
        collection, name, plural = _split(urlsplit(self.path).path)
        obj = self._body()
        known = self.store.objects.get((collection, str(name)))
        if known is None:
            self._status(HTTPStatus.NOT_FOUND, f'{plural} "{name}" not found')
            return
        meta = obj.setdefault("metadata", {})
        if (
            meta.get("resourceVersion", known["metadata"]["resourceVersion"])
            != known["metadata"]["resourceVersion"]
        ):
            self._status(HTTPStatus.CONFLICT, f'{plural} "{name}": the object has been modified')
            return
        meta["uid"] = known["metadata"]["uid"]
        self._write(obj, collection, plural, created=False)

    def do_DELETE(self) -> None:
        collection, name, plural = _split(urlsplit(self.path).path)
        with self.store.lock:
            gone = self.store.objects.pop((collection, str(name)), None)
        if gone is None:
            self._status(HTTPStatus.NOT_FOUND, f'{plural} "{name}" not found')
        else:
            self._send(HTTPStatus.OK, gone)


@contextmanager
def api_server() -> Iterator[tuple[str, Store]]:
    """The server's URL and its store, for the time of the block."""
    store = Store()
    handler = type("Handler", (_Handler,), {"store": store})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()
