"""A small Kubernetes API server for tests: pods and events over real HTTP, with watch streams.

kmock (PyPI) was tried first and falls short for the pod source: its lists answer the
resourceVersion "..." and its watches replay every object rather than resume from a version,
it ignores fieldSelector, and it cannot answer 410 Gone for a version compacted away. This
server does those the way kube-apiserver does: every change gets the next resourceVersion;
``GET /api/v1/pods`` lists (fieldSelector ``spec.nodeName=X``) with the list's version; with
``watch=true`` it streams, as JSON lines, every change after ``resourceVersion``, or one
ERROR event with a 410 Status when that version is older than the compaction point; it posts
Events under ``/api/v1/namespaces/NS/events``. ``down()``/``up()`` stop and restart it on the
same port (its streams cut), ``expire()`` compacts the history and cuts the streams.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # a watch ends when the connection closes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        api = self.server.api
        api.requests.append(f"GET {self.path}")
        if url.path != "/api/v1/pods":
            self._reply(404, _status(404, "NotFound", f"no route {url.path}"))
            return
        node = _node_selector(query.get("fieldSelector", ""))
        if query.get("watch") not in ("true", "1"):
            items, version = api.list(node)
            meta = {"resourceVersion": str(version)}
            self._reply(
                200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.flush()
        try:
            for event in api.stream(node, int(query.get("resourceVersion") or 0)):
                self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()
        except OSError:
            pass

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        api = self.server.api
        api.requests.append(f"POST {self.path}")
        parts = url.path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "events":
            event = api.add_event(parts[3], body)
            self._reply(201, event)
            return
        self._reply(404, _status(404, "NotFound", f"no route {url.path}"))


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


def _node_selector(selector: str) -> str | None:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key == "spec.nodeName":
            return value.lstrip("=")
    return None


def _matches(pod: dict[str, Any], node: str | None) -> bool:
    return node is None or pod.get("spec", {}).get("nodeName") == node


class ApiServer:
    """Pods by (namespace, name); change them with put_pod / delete_pod from the test."""

    def __init__(self) -> None:
        self.version = 1
        self.compacted = 0  # watches from before this version get 410 Gone
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.requests: list[str] = []
        self._changed = threading.Condition()
        self._generation = 0  # bumped to cut the open streams
        self._uids = 0
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }))  # fmt: skip
        return path

    # Life

    def up(self) -> None:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.api = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop answering: the port closed and every open watch cut."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._cut()

    def expire(self) -> None:
        """Compact the history: a watch resumed from an older version gets 410 Gone."""
        with self._changed:
            self.compacted = self.version + 1  # every version handed out so far
            self.history.clear()
        self._cut()

    def _cut(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    # Objects

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
    ) -> dict[str, Any]:
        """Create or replace a pod (ADDED or MODIFIED); ``security`` and ``container_security``
        are the pod's and its container's securityContext."""
        with self._changed:
            old = self.pods.get((namespace, name))
            self.version += 1
            if old is None:
                self._uids += 1
                uid = f"00000000-0000-4000-8000-{self._uids:012d}"
                created = f"2026-01-01T00:00:{self._uids % 60:02d}Z"
            else:
                uid, created = old["metadata"]["uid"], old["metadata"]["creationTimestamp"]
            container: dict[str, Any] = {
                "name": "main", "image": "busybox", "resources": {"limits": resources or {}}
            }  # fmt: skip
            if container_security is not None:
                container["securityContext"] = container_security
            spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
            if security is not None:
                spec["securityContext"] = security
            pod = {
                "kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "uid": uid,
                             "resourceVersion": str(self.version), "creationTimestamp": created,
                             "annotations": annotations or {}},
                "spec": spec,
                "status": {"phase": phase},
            }  # fmt: skip
            self.pods[(namespace, name)] = pod
            self._record("ADDED" if old is None else "MODIFIED", pod)
            return pod

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        with self._changed:
            pod = self.pods.pop((namespace, name))
            self.version += 1
            pod = copy.deepcopy(pod)
            pod["metadata"]["resourceVersion"] = str(self.version)
            self._record("DELETED", pod)

    def _record(self, kind: str, pod: dict[str, Any]) -> None:
        self.history.append((self.version, kind, copy.deepcopy(pod)))
        self._changed.notify_all()

    def add_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        with self._changed:
            self.version += 1
            stored = copy.deepcopy(event)
            meta = stored.setdefault("metadata", {})
            meta["namespace"] = namespace
            meta.setdefault("name", meta.get("generateName", "event.") + str(self.version))
            meta["resourceVersion"] = str(self.version)
            self.events.append(stored)
            return stored

    def list(self, node: str | None) -> tuple[list[dict[str, Any]], int]:
        with self._changed:
            items = [copy.deepcopy(p) for p in self.pods.values() if _matches(p, node)]
            return items, self.version

    def stream(self, node: str | None, since: int) -> Iterator[dict[str, Any]]:
        """The watch: changes after ``since`` as they come, until the stream is cut."""
        with self._changed:
            generation = self._generation
            if since < self.compacted:
                why = f"too old resource version: {since} ({self.compacted})"
                yield {"type": "ERROR", "object": _status(410, "Expired", why)}
                return
        sent = since
        while True:
            with self._changed:
                while generation == self._generation and not (
                    self.history and self.history[-1][0] > sent
                ):
                    self._changed.wait(timeout=1.0)
                if generation != self._generation:
                    return
                pending = [(v, k, p) for v, k, p in self.history if v > sent]
            for version, kind, pod in pending:
                sent = version
                if _matches(pod, node):
                    yield {"type": kind, "object": pod}
