"""Kubernetes tokens accepted through TokenReview, against a small API-server stand-in that
answers real TokenReview requests over HTTP."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.hypervisor.conftest import Daemon

# token → (username, groups); any other token is not authenticated.
USERS = {
    "sa-token-ops": ("system:serviceaccount:ops:admin", ["system:serviceaccounts", "ops"]),
    "sa-token-app": ("system:serviceaccount:app:default", ["system:serviceaccounts"]),
}
DAEMON_CREDENTIAL = "the-daemons-own-token"


class ApiServer(ThreadingHTTPServer):
    reviews: list[dict[str, Any]]
    authorizations: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer

    def do_POST(self) -> None:
        if self.path != "/apis/authentication.k8s.io/v1/tokenreviews":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.reviews.append(body)
        self.server.authorizations.append(self.headers.get("Authorization", ""))
        token = body["spec"]["token"]
        if token in USERS:
            name, groups = USERS[token]
            status = {"authenticated": True, "user": {"username": name, "groups": groups}}
        else:
            status = {"authenticated": False, "error": "invalid bearer token"}
        answer = json.dumps({**body, "status": status}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[ApiServer]:
    server = ApiServer(("127.0.0.1", 0), _Handler)
    server.reviews, server.authorizations = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_cluster_tokens_go_through_token_review_and_are_cached(
    tmp_path: Path, api_server: ApiServer
) -> None:
    from vgpu_hypervisor.daemon.api.token_review import TokenReviewer

    credential = tmp_path / "sa-token"
    credential.write_text(DAEMON_CREDENTIAL + "\n")
    now = [0.0]
    url = f"http://127.0.0.1:{api_server.server_address[1]}"
    reviewer = TokenReviewer(
        url + "/apis/authentication.k8s.io/v1/tokenreviews",
        ["ops"],
        credential=credential,
        ca_file=None,
        ttl_s=60,
        refusal_ttl_s=10,
        clock=lambda: now[0],
    )
    try:
        ops = reviewer.review("sa-token-ops")
        assert (ops.authenticated, ops.allowed) == (True, True)
        assert ops.reason == "system:serviceaccount:ops:admin"
        app = reviewer.review("sa-token-app")
        assert (app.authenticated, app.allowed) == (True, False)
        assert "may not use this node's API" in app.reason
        bad = reviewer.review("forged")
        assert (bad.authenticated, bad.allowed, bad.reason) == (
            False,
            False,
            "invalid bearer token",
        )
        assert api_server.authorizations == [f"Bearer {DAEMON_CREDENTIAL}"] * 3
        assert api_server.reviews[0]["kind"] == "TokenReview"

        for _ in range(5):  # cached: no more reviews
            reviewer.review("sa-token-ops")
            reviewer.review("forged")
        assert len(api_server.reviews) == 3
        now[0] = 11.0  # the refusal expired, the acceptance not yet
        reviewer.review("sa-token-ops")
        reviewer.review("forged")
        assert len(api_server.reviews) == 4
        now[0] = 61.0
        reviewer.review("sa-token-ops")
        assert len(api_server.reviews) == 5
    finally:
        reviewer.close()


def test_the_daemon_accepts_an_allowed_service_account_token(
    tmp_path: Path, api_server: ApiServer
) -> None:
    url = f"http://127.0.0.1:{api_server.server_address[1]}"
    daemon = Daemon(
        tmp_path,
        extra=(
            "--token-review",
            "--token-review-url",
            url + "/apis/authentication.k8s.io/v1/tokenreviews",
            "--token-review-allow",
            "ops",
        ),
    )
    daemon.start()
    try:
        body = {"name": "p", "gpus": {"0": {"memory": "1GiB"}}}

        def post(token: str) -> Any:
            return daemon.http.post(
                "/api/v1/pods", json=body, headers={"Authorization": f"Bearer {token}"}
            )

        refused = post("forged")
        assert refused.status_code == 401
        assert refused.json() == {"error": "token refused: invalid bearer token"}
        not_allowed = post("sa-token-app")
        assert not_allowed.status_code == 403
        assert "system:serviceaccount:app:default may not use" in not_allowed.json()["error"]
        assert post("sa-token-ops").status_code == 201
        assert post(daemon.token).status_code == 409  # the token file still works
        assert [r["spec"]["token"] for r in api_server.reviews] == [
            "forged",
            "sa-token-app",
            "sa-token-ops",
        ]
    finally:
        daemon.stop()


def test_an_unreachable_api_server_is_503(tmp_path: Path) -> None:
    daemon = Daemon(
        tmp_path, extra=("--token-review", "--token-review-url", "http://127.0.0.1:9/x")
    )
    daemon.start()
    try:
        answer = daemon.http.post(
            "/api/v1/pods",
            json={"name": "p", "gpus": {"0": {}}},
            headers={"Authorization": "Bearer some-token"},
        )
        assert answer.status_code == 503
        assert answer.json()["error"].startswith("TokenReview at http://127.0.0.1:9/x:")
    finally:
        daemon.stop()
