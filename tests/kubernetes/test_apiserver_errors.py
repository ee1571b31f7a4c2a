"""Every bad request to the API-server stand-in is answered as upstream answers: a ``Status``
with its code and reason, on a connection that still serves the next request."""

import json
import socket
from typing import Any

import httpx
import pytest

from tests.support.apiserver import ApiServer

PODS = "/api/v1/namespaces/default/pods"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "main", "image": "busybox"}]},
}
JSON = {"Content-Type": "application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}

Case = tuple[str, str, bytes | None, dict[str, str], int, str]  # method, path, body, headers,
# and the answer's code and reason

BAD: list[Case] = [
    ("POST", PODS, b"{not json", JSON, 400, "BadRequest"),
    ("POST", PODS, b"[1, 2]", JSON, 400, "BadRequest"),
    ("POST", PODS, b"", JSON, 400, "BadRequest"),
    ("POST", PODS, json.dumps({**POD, "metadata": {"name": {"a": 1}}}).encode(), JSON, 400,
     "BadRequest"),
    ("POST", PODS, json.dumps({**POD, "spec": {"containers": "main"}}).encode(), JSON, 400,
     "BadRequest"),
    ("POST", PODS, json.dumps({**POD, "kind": "ConfigMap"}).encode(), JSON, 400, "BadRequest"),
    ("POST", PODS, json.dumps(POD).encode(), {"Content-Type": "text/plain"}, 415,
     "UnsupportedMediaType"),
    ("POST", PODS, b"k8s\x00\xff\xff", {"Content-Type": "application/vnd.kubernetes.protobuf"},
     400, "BadRequest"),
    ("POST", PODS, b"not protobuf", {"Content-Type": "application/vnd.kubernetes.protobuf"},
     400, "BadRequest"),
    ("POST", PODS + "/p", json.dumps(POD).encode(), JSON, 405, "MethodNotAllowed"),
    ("POST", "/api/v1/namespaces/nope/pods", json.dumps(POD).encode(), JSON, 404, "NotFound"),
    ("PUT", PODS + "/p", b'"a string"', JSON, 400, "BadRequest"),
    ("PUT", PODS + "/p", json.dumps({**POD, "spec": {"nodeName": 7}}).encode(), JSON, 400,
     "BadRequest"),
    ("PATCH", PODS + "/p", b"{}", {"Content-Type": "application/x-frob"}, 415,
     "UnsupportedMediaType"),
    ("PATCH", PODS + "/p", b'{"spec": {"containers": 3}}', MERGE, 422, "Invalid"),
    ("PATCH", PODS + "/p", b"{oops", MERGE, 400, "BadRequest"),
    ("PATCH", PODS + "/p", b"[{}]", {"Content-Type": "application/json-patch+json"}, 422,
     "Invalid"),
    ("PATCH", PODS + "/p?fieldManager=t", b"a: [", {"Content-Type": "application/apply-patch+yaml"},
     400, "BadRequest"),
    ("PATCH", PODS + "/p?fieldManager=t", b"- 1", {"Content-Type": "application/apply-patch+yaml"},
     400, "BadRequest"),
    ("GET", PODS + "?limit=lots", None, {}, 400, "BadRequest"),
    ("GET", PODS + "?limit=-1", None, {}, 400, "BadRequest"),
    ("GET", PODS + "?continue=eyJ2IjogMX0", None, {}, 400, "BadRequest"),
    ("GET", PODS + "?watch=true&timeoutSeconds=soon", None, {}, 400, "BadRequest"),
    ("GET", PODS + "?watch=true&resourceVersion=abc", None, {}, 400, "BadRequest"),
    ("GET", PODS + "?labelSelector=a%20b%20c", None, {}, 400, "BadRequest"),
    ("GET", PODS + "?fieldSelector=spec.image%3Dx", None, {}, 400, "BadRequest"),
    ("GET", PODS, None, {"Accept": "application/vnd.kubernetes.protobuf"}, 406, "NotAcceptable"),
    ("GET", "/api/v1/frobs", None, {}, 404, "NotFound"),
    ("GET", "/nothing/here", None, {}, 404, "NotFound"),
    ("GET", PODS + "/p/log", None, {}, 404, "NotFound"),
    ("DELETE", PODS + "/p", b"[]", JSON, 400, "BadRequest"),
    ("DELETE", PODS + "/p", b'{"gracePeriodSeconds": "soon"}', JSON, 400, "BadRequest"),
    ("DELETE", PODS + "/p", b'{"preconditions": "x"}', JSON, 400, "BadRequest"),
    ("DELETE", PODS + "/p?gracePeriodSeconds=soon", None, {}, 400, "BadRequest"),
    ("OPTIONS", PODS, None, {}, 405, "MethodNotAllowed"),
    ("BREW", PODS, None, {}, 405, "MethodNotAllowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    "case", BAD, ids=[f"{m} {p.rsplit('/', 1)[-1]} {c}" for m, p, _, _, c, _ in BAD]
)
def test_a_bad_request_gets_a_status(api: ApiServer, case: Case) -> None:
    method, path, body, headers, code, reason = case
    api.put_pod("p")
    with httpx.Client(base_url=api.url, timeout=30) as http:
        reply = http.request(method, path, content=body, headers=headers)
        assert "Traceback" not in reply.text
        status: dict[str, Any] = reply.json()
        assert (reply.status_code, status["kind"], status["code"], status["reason"]) == (
            code,
            "Status",
            code,
            reason,
        ), status
        assert status["status"] == "Failure" and status["message"]
        # The connection (or a new one) serves the next request.
        assert http.get(PODS + "/p").json()["metadata"]["name"] == "p"


def _raw(api: ApiServer, request: bytes) -> tuple[str, dict[str, Any]]:
    with socket.create_connection(("127.0.0.1", api.port), timeout=30) as connection:
        connection.sendall(request)
        reply = b""
        while chunk := connection.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], json.loads(body)


def test_requests_http_cannot_read_get_a_status_too(api: ApiServer) -> None:
    line, status = _raw(api, b"GET /api HTTP/9.x\r\n\r\n")
    assert line.split()[1] == "400" and status["kind"] == "Status" and status["code"] == 400
    bad_length = (
        b"POST /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: many\r\n\r\n{}"
    )
    line, status = _raw(api, bad_length)
    assert line.split()[1] == "400" and status["reason"] == "BadRequest"


def test_a_chunked_body_is_read_whole(api: ApiServer) -> None:
    body = json.dumps(POD).encode()

    def chunks() -> Any:
        yield body[:10]
        yield body[10:]

    with httpx.Client(base_url=api.url, timeout=30) as http:
        made = http.post(PODS, content=chunks(), headers=JSON)
        assert made.status_code == 201, made.text
        assert http.get(PODS + "/p").json()["metadata"]["uid"] == made.json()["metadata"]["uid"]


def test_a_head_request_is_answered_without_a_body(api: ApiServer) -> None:
    api.put_pod("p")
    with httpx.Client(base_url=api.url, timeout=30) as http:
        reply = http.head(PODS + "/p")
        assert reply.status_code == 200 and reply.content == b""
        assert http.head(PODS + "/nope").status_code == 404
