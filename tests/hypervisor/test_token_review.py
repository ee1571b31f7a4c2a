"""Kubernetes tokens accepted through TokenReview, against a small API-server stand-in that
answers real TokenReview requests over HTTP."""

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
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
    delay_s: float  # each review takes this long (a slow or loaded API server)
    in_flight: int  # reviews being answered now
    most_in_flight: int
    lock: threading.Lock


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer

    def do_POST(self) -> None:
        if self.path != "/apis/authentication.k8s.io/v1/tokenreviews":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.reviews.append(body)
            server.authorizations.append(self.headers.get("Authorization", ""))
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        time.sleep(server.delay_s)
        with server.lock:
            server.in_flight -= 1
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
    server.delay_s, server.in_flight, server.most_in_flight = 0.0, 0, 0
    server.lock = threading.Lock()
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
    from vgpu_hypervisor.kubernetes.token_review import TokenReviewer

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


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _flood(base: str, client: int, until: float) -> dict[int, int]:
    """A new made-up token with every request, on one kept-alive connection, until ``until``;
    the statuses answered, counted."""
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base, timeout=30) as http:
        sent = 0
        while time.monotonic() < until:
            sent += 1
            status = http.get("/api/v1/pods", headers=_bearer(f"made-up-{client}-{sent}"))
            statuses[status.status_code] = statuses.get(status.status_code, 0) + 1
            time.sleep(0.005)  # leaves the test's own holder thread the GIL now and then
    return statuses


def _holders(base: str, tokens: tuple[str, ...], until: float) -> list[tuple[int, float]]:
    """Each token's read on a new connection every 0.1 s until ``until``: (status, seconds)."""
    answers = []
    while time.monotonic() < until:
        for token in tokens:
            started = time.monotonic()
            with httpx.Client(base_url=base, timeout=30) as http:
                status = http.get("/api/v1/pods", headers=_bearer(token)).status_code
            answers.append((status, time.monotonic() - started))
        time.sleep(0.1)
    return answers


def test_a_flood_of_made_up_tokens_neither_hangs_the_api_nor_shuts_token_holders_out(
    tmp_path: Path, api_server: ApiServer
) -> None:
    """24 clients send a new made-up token with every request, for 4 s, to an API server that
    takes 0.3 s a review: at most 8 reviews are under way at once (MAX_REVIEWS), each made-up
    token is answered 401 or, past the 8, 503 at once, never a 500 or a hang; the token file's
    holder and a cluster token reviewed before are answered meanwhile as if nothing happened,
    and once the flood ends a new cluster token is reviewed (no review slot was lost)."""
    api_server.delay_s = 0.3
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
    base = f"http://127.0.0.1:{daemon.port}"
    try:
        reviewed = daemon.http.get("/api/v1/pods", headers=_bearer("sa-token-ops"))
        assert reviewed.status_code == 200, reviewed.text
        until = time.monotonic() + 4.0
        with ThreadPoolExecutor(max_workers=25) as pool:
            floods = [pool.submit(_flood, base, client, until) for client in range(24)]
            held = pool.submit(_holders, base, (daemon.token, "sa-token-ops"), until)
            statuses: dict[int, int] = {}
            for one in floods:
                for status, count in one.result(timeout=60).items():
                    statuses[status] = statuses.get(status, 0) + count
            answered = held.result(timeout=60)

        assert set(statuses) <= {401, 503}, statuses
        assert statuses.get(503, 0) > 0 and statuses.get(401, 0) > 0, statuses  # the cap was hit
        assert api_server.most_in_flight <= 8, api_server.most_in_flight
        assert len(answered) >= 6
        assert {status for status, _ in answered} == {200}, answered
        # Never behind the reviews: the token file's token is checked before any review slot
        # (a wait there is 0.3 s a review); the bound allows for a loaded 2-core machine.
        assert max(seconds for _, seconds in answered) < 2.0, answered
        assert daemon.http.get("/healthz").status_code == 200
        with api_server.lock:
            before = len(api_server.reviews)
        fresh = daemon.http.get("/api/v1/pods", headers=_bearer("sa-token-app"))
        assert fresh.status_code == 403, fresh.text  # reviewed: every slot came back
        assert len(api_server.reviews) == before + 1
    finally:
        assert daemon.stop() == 0
    log = daemon.log_file.read_text()
    assert "Traceback" not in log, log
