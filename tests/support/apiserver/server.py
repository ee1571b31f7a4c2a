"""The HTTP side: routes, discovery, watches, tables, and the server's life.

Plain HTTP/1.1 on 127.0.0.1 (kubectl, the official Python client and lightkube all take an
``http://`` server from a kubeconfig), answering in JSON (a client asking for protobuf alone
gets 406) and reading bodies in JSON, YAML or protobuf (protobuf.py),
keep-alive for ordinary answers and chunked transfer for watches, so a watch that ends (its
``timeoutSeconds``, or the test cutting it) ends as upstream's do.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from tests.support.apiserver import apply as applying
from tests.support.apiserver import patch as patches
from tests.support.apiserver import protobuf, selectors
from tests.support.apiserver.errors import ApiError
from tests.support.apiserver.kinds import (
    BUILTIN,
    EVENT,
    NAMESPACE,
    POD,
    Kind,
    drop_device_taints,
)
from tests.support.apiserver.schemas import Schemas
from tests.support.apiserver.store import Object, Store, Writer, timestamp

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_DEFAULT_WATCH_S = 1800  # upstream picks between 30 and 60 minutes
_TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer

    def __init__(self, address: tuple[str, int], api: ApiServer) -> None:
        self.api = api
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def cut_connections(self) -> None:
        with self.connections_lock:
            for connection in list(self.connections):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)


class _Route:
    """What a path names: a kind, maybe a namespace, a name and a subresource."""

    def __init__(self, kind: Kind, namespace: str | None, name: str | None, sub: str | None):
        self.kind, self.namespace, self.name, self.sub = kind, namespace, name, sub


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # Answers

    def _send(
        self,
        code: int,
        document: Any,
        content_type: str = "application/json",
        warnings: list[str] | None = None,
    ) -> None:
        body = json.dumps(document).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for warning in warnings or []:
            self.send_header("Warning", f'299 - "{warning}"')
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_body(self) -> bytes:
        """The request's body, read whole before anything is answered (a body left unread
        would be taken for the connection's next request)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            try:
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            except ValueError:
                self.close_connection = True
                raise ApiError(400, "BadRequest", "the chunked body is malformed") from None
            while self.rfile.readline().strip():
                pass  # trailers
            return b"".join(parts)
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            self.close_connection = True
            raise ApiError(400, "BadRequest", f"Content-Length {length!r} is not a length")
        return self.rfile.read(int(length)) if int(length) else b""

    def _raw(self) -> bytes:
        if not self.payload:
            raise ApiError(400, "BadRequest", "the request has no body")
        return self.payload

    def _body(self) -> Any:
        """An object sent to create or replace, in JSON, YAML or protobuf (as typed clients
        send built-in kinds)."""
        content = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        raw = self._raw()
        if content == protobuf.CONTENT_TYPE:
            return protobuf.decode(raw)
        if content in ("application/json", "application/yaml"):
            return _document(raw, yaml_too=content == "application/yaml")
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json, application/yaml, {protobuf.CONTENT_TYPE}",
        )

    def _handle(self) -> None:
        api = self.server.api
        api.requests.append(f"{self.command} {self.path}")
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        accept = self.headers.get("Accept", "application/json")
        self.payload = b""
        try:
            self.payload = self._read_body()
            if not any(
                t.split(";")[0].strip() in ("application/json", "*/*", "application/*")
                for t in accept.split(",")
            ):
                raise ApiError(
                    406, "NotAcceptable", f"only application/json is served, not {accept}"
                )
            if self.command == "GET" and self._discovery(url.path):
                return
            route = api.route(url.path)
            verb = {"GET": self._get, "HEAD": self._get, "POST": self._post, "PUT": self._put,
                    "PATCH": self._patch, "DELETE": self._delete}.get(self.command)  # fmt: skip
            if verb is None:
                raise ApiError(405, "MethodNotAllowed", f"{self.command} is not supported")
            verb(route, query, accept)
        except ApiError as error:
            self._send(error.code, error.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except OSError:
            self.close_connection = True
        except Exception as error:  # a fault of the stand-in's own: a Status, not a traceback
            self.close_connection = True
            failure = ApiError(500, "InternalError", f"Internal error occurred: {error!r}")
            self._send(500, failure.status())

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _handle

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a request line or headers it cannot read, a URI too
        long) as a Status, not its HTML page."""
        self.close_connection = True
        self.request_version = "HTTP/1.1"  # a request line it could not read: headers still go
        code = 405 if code == 501 else code  # a method it has no handler for
        reason = {404: "NotFound", 405: "MethodNotAllowed", 414: "RequestURITooLong",
                  431: "RequestHeaderFieldsTooLarge"}.get(code, "BadRequest")  # fmt: skip
        status = ApiError(code, reason, message or explain or "the request is malformed").status()
        body = json.dumps(status).encode()
        with contextlib.suppress(OSError):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(body)

    # Discovery

    def _discovery(self, path: str) -> bool:
        api = self.server.api
        document = api.discovery(path.rstrip("/") or "/")
        if document is None:
            return False
        self._send(200, document)
        return True

    # Verbs

    def _get(self, route: _Route, query: dict[str, str], accept: str) -> None:
        api = self.server.api
        table = "as=Table" in accept.replace(" ", "")
        if route.name is not None and query.get("watch") not in ("true", "1"):
            obj = api.store.get(route.kind, route.namespace, route.name)
            if table:
                self._send(200, _table(route.kind, [obj], query), _TABLE)
            else:
                self._send(200, obj)
            return
        selector = selectors.Selector(
            selectors.labels(query.get("labelSelector", "")),
            selectors.fields(query.get("fieldSelector", ""), route.kind.selectable),
        )
        if route.name is not None:  # a watch of one object, as upstream's deprecated path
            selector = selectors.Selector(
                selector.labels, (*selector.fields, ("metadata.name", True, route.name))
            )
        if query.get("watch") in ("true", "1"):
            self._watch(route, selector, query, table)
            return
        at, after = _continued(query.get("continue"))
        items, version = api.store.select(route.kind, route.namespace, selector, at)
        items = sorted((i for i in items if _key(i) > after), key=_key)
        limit = query.get("limit") or "0"
        if not limit.isdigit():
            raise ApiError(400, "BadRequest", f"limit must be a whole number, not {limit!r}")
        meta: Object = {"resourceVersion": str(version)}
        if 0 < int(limit) < len(items):
            items, rest = items[: int(limit)], items[int(limit) :]
            meta["continue"] = _continue_token(version, _key(items[-1]))
            if not selector.labels and not selector.fields:
                meta["remainingItemCount"] = len(rest)
        if table:
            self._send(200, _table(route.kind, items, query, meta), _TABLE)
            return
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        self._send(
            200,
            {
                "kind": f"{route.kind.kind}List",
                "apiVersion": route.kind.group_version,
                "metadata": meta,
                "items": items,
            },
        )

    def _watch(
        self, route: _Route, selector: selectors.Selector, query: dict[str, str], table: bool
    ) -> None:
        api = self.server.api
        version = query.get("resourceVersion", "")
        if version and not version.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version {version!r}")
        initial = query.get("sendInitialEvents") == "true"
        timeout = _number(query, "timeoutSeconds", _DEFAULT_WATCH_S)
        events = api.store.changes(
            route.kind,
            route.namespace,
            selector,
            None if initial or not version else int(version),
            deadline=time.monotonic() + timeout,
            bookmark_s=api.bookmark_s if query.get("allowWatchBookmarks") == "true" else None,
            initial_end_bookmark=initial,
            gone=self._client_gone,
        )
        self.send_response(200)
        self.send_header("Content-Type", _TABLE if table else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._chunk(b"")  # headers out at once: clients wait for them
            try:
                for event in events:
                    if table and event["type"] != "BOOKMARK":
                        row = _table(route.kind, [event["object"]], query)
                        self._chunk(
                            json.dumps({"type": event["type"], "object": row}).encode() + b"\n"
                        )
                    else:
                        self._chunk(json.dumps(event).encode() + b"\n")
            except ApiError as error:  # a version compacted away: upstream says so in the stream
                self._chunk(
                    json.dumps({"type": "ERROR", "object": error.status()}).encode() + b"\n"
                )
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _client_gone(self) -> bool:
        """Whether the client closed its end (a watch it no longer reads)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _post(self, route: _Route, query: dict[str, str], accept: str) -> None:
        if route.name is not None:
            raise ApiError(405, "MethodNotAllowed", f"POST is not allowed on {self.path}")
        api = self.server.api
        obj, warnings = api.store.create(
            route.kind,
            route.namespace,
            self._body(),
            strict=query.get("fieldValidation") == "Strict",
            dry_run="dryRun" in query,
            writer=self._writer(route, query),
        )
        self._send(201, obj, warnings=warnings)

    def _writer(self, route: _Route, query: dict[str, str]) -> Writer:
        """Who writes: the request's fieldManager, else the client's name from its User-Agent
        (``kubectl/v1.32.4 (linux/amd64) …`` is ``kubectl``), as upstream names managers."""
        agent = (self.headers.get("User-Agent") or "").split("/")[0].strip()
        manager = query.get("fieldManager") or agent[:128] or "unknown"
        return Writer(manager, route.sub)

    def _put(self, route: _Route, query: dict[str, str], accept: str) -> None:
        body = self._body()
        self.server.api.schemas.decode(route.kind, body)  # a body that does not decode: 400
        self._update(route, query, lambda _: body)

    def _patch(self, route: _Route, query: dict[str, str], accept: str) -> None:
        content = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content == "application/apply-patch+yaml":
            self._apply(route, query)
            return
        body = _document(self._raw(), yaml_too=False)
        api = self.server.api
        if content == "application/merge-patch+json":
            self._update(route, query, lambda current: patches.merge_patch(current, body))
        elif content == "application/json-patch+json":
            self._update(route, query, lambda current: patches.json_patch(current, body))
        elif content == "application/strategic-merge-patch+json":
            schema = api.schemas.root(route.kind)
            self._update(
                route,
                query,
                lambda current: patches.strategic_merge(current, body, schema, api.schemas.resolve),
            )
        else:
            raise ApiError(
                415, "UnsupportedMediaType", f"the patch type {content!r} is not supported"
            )

    def _apply(self, route: _Route, query: dict[str, str]) -> None:
        """Server-side apply: the object made from the configuration (201) where there is
        none, else the configuration merged into it (apply.py)."""
        api = self.server.api
        manager = query.get("fieldManager")
        if not manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                "is required for apply patch",
            )
        if route.name is None:
            raise ApiError(405, "MethodNotAllowed", "PATCH needs an object's name")
        config = _document(self._raw(), yaml_too=True)
        _check_applied(config, route)
        schema, now = api.schemas.root(route.kind), timestamp(api.store.clock())
        force = query.get("force") == "true"
        strict = query.get("fieldValidation") == "Strict"

        def merged(live: Object | None) -> Object:
            return applying.apply(live, config, schema, api.schemas.resolve, manager=manager,
                                  force=force, subresource=route.sub, now=now)  # fmt: skip

        try:
            self._update(route, query, merged, tracked=False)  # the apply records its fields
        except ApiError as error:
            if error.code != 404 or route.sub is not None or error.reason != "NotFound":
                raise
            if (error.details or {}).get("kind") != route.kind.plural:
                raise  # the namespace is missing, not the object
            obj, warnings = api.store.create(
                route.kind, route.namespace, merged(None), strict=strict,
                dry_run="dryRun" in query,
            )  # fmt: skip
            self._send(201, obj, warnings=warnings)

    def _update(
        self, route: _Route, query: dict[str, str], change: Any, *, tracked: bool = True
    ) -> None:
        if route.name is None:
            raise ApiError(405, "MethodNotAllowed", f"{self.command} needs an object's name")
        if route.sub not in (None, "status"):
            raise ApiError(404, "NotFound", f"no subresource {route.sub!r}")

        def apply(current: Object) -> Object:
            try:
                result: Object = change(current)
            except patches.PatchError as error:
                raise ApiError(422, "Invalid", f"the patch does not apply: {error}") from None
            return result

        obj, warnings = self.server.api.store.update(
            route.kind,
            route.namespace,
            route.name,
            apply,
            subresource=route.sub,
            strict=query.get("fieldValidation") == "Strict",
            dry_run="dryRun" in query,
            writer=self._writer(route, query) if tracked else None,
        )
        self._send(200, obj, warnings=warnings)

    def _delete(self, route: _Route, query: dict[str, str], accept: str) -> None:
        store = self.server.api.store
        options: Any = self._body() if self.payload else {}
        if not isinstance(options, dict):
            raise ApiError(400, "BadRequest", f"the DeleteOptions are not an object: {options!r}")
        preconditions = options.get("preconditions") or {}
        grace = _number(query, "gracePeriodSeconds", options.get("gracePeriodSeconds"))
        if not isinstance(preconditions, dict) or not isinstance(grace, int | None):
            raise ApiError(400, "BadRequest", f"the DeleteOptions are not valid: {options!r}")
        dry_run = "dryRun" in query or bool(options.get("dryRun"))
        if route.name is None:  # deletecollection
            selector = selectors.Selector(
                selectors.labels(query.get("labelSelector", "")),
                selectors.fields(query.get("fieldSelector", ""), route.kind.selectable),
            )
            items, _ = store.select(route.kind, route.namespace, selector)
            for item in items:
                with contextlib.suppress(ApiError):
                    store.delete(
                        route.kind,
                        item["metadata"].get("namespace"),
                        item["metadata"]["name"],
                        grace=grace,
                        dry_run=dry_run,
                    )
            self._send(
                200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
            )
            return
        obj = store.delete(
            route.kind,
            route.namespace,
            route.name,
            grace=grace,
            uid=preconditions.get("uid"),
            version=preconditions.get("resourceVersion"),
            dry_run=dry_run,
        )
        self._send(200, obj)


def _check_applied(config: Any, route: _Route) -> None:
    """An applied configuration names its kind and the object of the URL, and leaves the
    managers to the server."""
    if not isinstance(config, dict) or not isinstance(config.get("metadata"), dict):
        raise ApiError(400, "BadRequest", "the applied configuration is not an object")
    kind = route.kind
    if (config.get("apiVersion"), config.get("kind")) != (kind.group_version, kind.kind):
        raise ApiError(
            400,
            "BadRequest",
            f"the applied configuration is {config.get('apiVersion')} {config.get('kind')}, "
            f"not the {kind.group_version} {kind.kind} of the URL",
        )
    if config["metadata"].get("name") != route.name:
        raise ApiError(
            400,
            "BadRequest",
            f"the name of the object ({config['metadata'].get('name')}) does not match the "
            f"name on the URL ({route.name})",
        )
    if config["metadata"].get("managedFields") is not None:
        raise ApiError(400, "BadRequest", "metadata.managedFields must be nil")


def _document(raw: bytes, *, yaml_too: bool) -> Any:
    """A JSON (or YAML, a superset) body; 400 BadRequest where it is neither."""
    try:
        return yaml.safe_load(raw) if yaml_too else json.loads(raw)
    except (ValueError, yaml.YAMLError) as error:
        kind = "YAML" if yaml_too else "JSON"
        raise ApiError(400, "BadRequest", f"the body is not {kind}: {error}") from None


def _number(query: dict[str, str], name: str, default: Any) -> Any:
    """A query parameter that is a whole number (``default`` where it is absent); 400
    BadRequest otherwise."""
    value = query.get(name) or ""
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, "BadRequest", f"{name} must be a whole number, not {value!r}") from None


def _key(obj: Object) -> str:
    """Where an object stands in a list: by namespace, then name (etcd's key order)."""
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def _continue_token(version: int, last: str) -> str:
    """A list's next page: the list's version and the last key given, as upstream's token."""
    document = {"v": "meta.k8s.io/v1", "rv": version, "start": last + "\x00"}
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")


def _continued(token: str | None) -> tuple[int | None, str]:
    """The version and the key after which a continued list goes on (None, "": from the
    start, now); 400 BadRequest for a token this server did not give."""
    if not token:
        return None, ""
    try:
        document = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        version, start = document["rv"], document["start"]
        if document["v"] != "meta.k8s.io/v1" or not isinstance(version, int) or version < 1:
            raise ValueError(document)
        if not isinstance(start, str) or not start.endswith("\x00"):
            raise ValueError(document)
    except (ValueError, KeyError, TypeError):
        raise ApiError(400, "BadRequest", "continue key is not valid") from None
    return version, start[:-1]


def _table(
    kind: Kind, items: list[Object], query: dict[str, str], meta: Object | None = None
) -> Object:
    """The server-side printing kubectl asks for: name, a pod's phase, age."""
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name"}]
    if kind is POD:
        columns.append({"name": "Status", "type": "string", "format": "", "description": "Phase"})
    columns.append({"name": "Age", "type": "string", "format": "", "description": "Age"})
    include = query.get("includeObject", "PartialObjectMetadata")
    rows = []
    for obj in items:
        cells: list[Any] = [obj["metadata"]["name"]]
        if kind is POD:
            cells.append(
                "Terminating"
                if obj["metadata"].get("deletionTimestamp")
                else obj.get("status", {}).get("phase", "")
            )
        cells.append(_age(obj["metadata"].get("creationTimestamp", "")))
        row: Object = {"cells": cells}
        if include == "Object":
            row["object"] = obj
        elif include == "PartialObjectMetadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta or {},
        "columnDefinitions": columns,
        "rows": rows,
    }


def _age(created: str) -> str:
    try:
        then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").timestamp()
    except ValueError:
        return "<unknown>"
    seconds = max(0, int(time.time() - then))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


class ApiServer:
    """A Kubernetes API server for tests, on a free port of 127.0.0.1.

    ``version`` is the Kubernetes version it says it is, whose published schemas check what
    clients create and update. ``stop_pods_s`` is how long its nodes take to stop a deleted
    pod (at most the pod's grace period; None: never, as a node that is gone). Watches that
    ask for bookmarks get one after ``bookmark_s`` without a change. ``feature_gates`` turns
    gated fields on: off (as by default in 1.34), ``DRADeviceTaints`` has ResourceSlices'
    device taints dropped as they are stored.
    """

    def __init__(
        self,
        *,
        version: str = "1.34.0",
        stop_pods_s: float | None = 0.5,
        bookmark_s: float = 1.0,
        namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public", "kube-node-lease"),
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        self.version = version
        self.bookmark_s = bookmark_s
        self.schemas = Schemas(version)
        self.requests: list[str] = []
        self.kinds: list[Kind] = []
        self.store = Store(
            self._validate,
            track=self._track,
            decode=self.schemas.decode,
            stop_pods_s=stop_pods_s,
        )
        gates = dict(feature_gates or {})
        taints = gates.get("DRADeviceTaints", False)
        for kind in BUILTIN:
            gated = kind.plural == "resourceslices" and not taints
            self.register(dataclasses.replace(kind, defaults=drop_device_taints) if gated else kind)
        for name in namespaces:
            self.store.create(
                NAMESPACE, None, {"metadata": {"name": name}}, strict=True, dry_run=False
            )
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self._server: _Server | None = None

    def register(self, kind: Kind) -> None:
        """Serve another kind (its group version appears in discovery)."""
        if self.schemas.definition(kind) is None:
            raise ValueError(
                f"Kubernetes {self.version} publishes no schema of {kind.group_version} {kind.kind}"
            )
        if any(
            (k.group, k.version, k.plural) == (kind.group, kind.version, kind.plural)
            for k in self.kinds
        ):
            raise ValueError(f"{kind.group_version} {kind.plural} is served already")
        self.kinds.append(kind)

    def _validate(self, obj: Object, strict: bool) -> list[str]:
        return self.schemas.validate(obj, strict=strict)

    def _track(self, kind: Kind, old: Object | None, new: Object, writer: Writer) -> None:
        applying.updated(old, new, self.schemas.root(kind), self.schemas.resolve,
                         manager=writer.manager, subresource=writer.subresource,
                         now=timestamp(self.store.clock()))  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig for any client (kubectl, the Python client, lightkube)."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "users": [{"name": "test", "user": {"token": "test-token"}}],
                    "contexts": [
                        {
                            "name": "test",
                            "context": {"cluster": "test", "user": "test", "namespace": namespace},
                        }
                    ],
                }
            )
        )
        return path

    # Life

    def up(self) -> None:
        server = _Server(("127.0.0.1", self.port), self)
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def down(self) -> None:
        """Stop answering: the port closed, every connection (watches among them) cut."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.cut_connections()
            self._server = None
        self.store.cut()

    def expire(self) -> None:
        """Compact the history: a watch resumed from an older version gets 410 Gone."""
        self.store.compact()

    def __enter__(self) -> ApiServer:
        self.up()
        return self

    def __exit__(self, *_: object) -> None:
        self.down()

    # Routing and discovery

    def _served(self, group: str, version: str) -> list[Kind]:
        return [k for k in self.kinds if (k.group, k.version) == (group, version)]

    def route(self, path: str) -> _Route:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({path})"
            )
        kinds = {k.plural: k for k in self._served(group, version)}
        namespace: str | None = None
        namespace_sub = (
            len(rest) == 3 and rest[0] == "namespaces" and rest[2] in ("status", "finalize")
        )
        if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_sub:
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in kinds or len(rest) > 3:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({path})"
            )
        kind = kinds[rest[0]]
        if kind.namespaced != (namespace is not None) and not (kind.namespaced and len(rest) == 1):
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({path})"
            )
        sub = rest[2] if len(rest) == 3 else None
        if sub is not None and not (sub == "status" and kind.status):
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({path})"
            )
        return _Route(kind, namespace, rest[1] if len(rest) > 1 else None, sub)

    def discovery(self, path: str) -> Object | None:
        """The document of a discovery or OpenAPI path, None for any other path."""
        major, minor = self.version.split(".")[:2]
        groups = sorted({(k.group, k.version) for k in self.kinds if k.group})
        names = list(dict.fromkeys(g for g, _ in groups))
        documents: dict[str, Callable[[], Object]] = {
            "/version": lambda: {"major": major, "minor": minor, "platform": "linux/amd64",
                                 "gitVersion": f"v{self.version}"},
            "/healthz": lambda: {"status": "ok"},
            "/readyz": lambda: {"status": "ok"},
            "/livez": lambda: {"status": "ok"},
            "/api": lambda: {"kind": "APIVersions", "versions": ["v1"],
                             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                             "serverAddress": self.url[7:]}]},
            "/apis": lambda: {"kind": "APIGroupList", "apiVersion": "v1",
                              "groups": [self._group(g) for g in names]},
            "/api/v1": lambda: self._resources("", "v1"),
            "/openapi/v3": lambda: {"paths": {
                gv: {"serverRelativeURL": f"/openapi/v3/{gv}"}
                for gv in ["api/v1", *(f"apis/{g}/{v}" for g, v in groups)]}},
            "/openapi/v3/api/v1": lambda: self.schemas.openapi(self._served("", "v1"), "v1"),
        }  # fmt: skip
        for group, version in groups:
            documents[f"/apis/{group}"] = partial(self._group_document, group)
            documents[f"/apis/{group}/{version}"] = partial(self._resources, group, version)
            documents[f"/openapi/v3/apis/{group}/{version}"] = partial(
                self.schemas.openapi, self._served(group, version), f"{group}/{version}"
            )
        make = documents.get(path)
        return None if make is None else make()

    def _group_document(self, group: str) -> Object:
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group(group)}

    def _group(self, group: str) -> Object:
        versions = [
            {"groupVersion": f"{group}/{k.version}", "version": k.version}
            for k in self.kinds
            if k.group == group
        ]
        unique = list({v["version"]: v for v in versions}.values())
        return {"name": group, "versions": unique, "preferredVersion": unique[0]}

    def _resources(self, group: str, version: str) -> Object:
        resources = []
        for kind in self._served(group, version):
            entry: Object = {
                "name": kind.plural,
                "singularName": kind.singular,
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": VERBS,
            }
            if kind.short_names:
                entry["shortNames"] = list(kind.short_names)
            if kind.categories:
                entry["categories"] = list(kind.categories)
            resources.append(entry)
            if kind.status:
                resources.append(
                    {
                        "name": f"{kind.plural}/status",
                        "singularName": "",
                        "namespaced": kind.namespaced,
                        "kind": kind.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # The tests' own hands (what a controller or the kubelet would do)

    def put(self, obj: Object) -> Object:
        """Create ``obj``, or write it over the one there (keeping its uid): as a controller
        writes it, checked against the schema but not against what updates may change."""
        kind = next(
            k for k in self.kinds if (k.group_version, k.kind) == (obj["apiVersion"], obj["kind"])
        )
        namespace = obj["metadata"].get("namespace", "default") if kind.namespaced else None
        if namespace is not None:
            self.ensure_namespace(namespace)
        return self.store.put(kind, namespace, obj)

    def ensure_namespace(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            self.store.create(
                NAMESPACE, None, {"metadata": {"name": name}}, strict=True, dry_run=False
            )

    def put_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        node: str = "node-a",
        annotations: dict[str, str] | None = None,
        resources: dict[str, str] | None = None,
        phase: str = "Running",
        security: dict[str, Any] | None = None,
        container_security: dict[str, Any] | None = None,
    ) -> Object:
        """A pod of one container ``main`` bound to ``node``, made or replaced; ``security`` and
        ``container_security`` are the pod's and its container's securityContext."""
        container: Object = {
            "name": "main",
            "image": "busybox",
            "resources": {"limits": resources or {}},
        }
        if container_security is not None:
            container["securityContext"] = container_security
        spec: Object = {"nodeName": node, "containers": [container]}
        if security is not None:
            spec["securityContext"] = security
        return self.put(
            {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "annotations": annotations or {},
                },
                "spec": spec,
                "status": {"phase": phase},
            }
        )

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """The pod gone at once, as after its node stopped it."""
        self.store.delete(POD, namespace, name, grace=0)

    def objects(self, kind: Kind, namespace: str | None = None) -> list[Object]:
        return self.store.select(kind, namespace, selectors.Selector())[0]

    @property
    def pods(self) -> dict[tuple[str, str], Object]:
        return {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.objects(POD)}

    @property
    def events(self) -> list[Object]:
        """The core Events, oldest first."""
        return sorted(self.objects(EVENT), key=lambda e: int(e["metadata"]["resourceVersion"]))
