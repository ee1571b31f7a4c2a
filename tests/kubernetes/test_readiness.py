"""In Kubernetes the daemon is ready only while it follows its node's pods: /readyz says 503,
naming the API server, while that is unreachable, and ready again once a list succeeds."""

from pathlib import Path

from tests.hypervisor.conftest import Daemon, wait_for
from tests.support.apiserver import ApiServer


def _kubernetes_check(daemon: Daemon) -> tuple[int, str | None]:
    reply = daemon.http.get("/readyz")
    return reply.status_code, reply.json()["checks"].get("kubernetes")


def test_readyz_follows_the_api_server(tmp_path: Path, api: ApiServer) -> None:
    flags = ("--kubernetes", "--node-name", "node-a", "--kube-backoff-max", "0.5",
             "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")))  # fmt: skip
    daemon = Daemon(tmp_path / "node", extra=flags)
    daemon.start()
    try:
        assert wait_for(lambda: _kubernetes_check(daemon) == (200, "ok"), timeout=20)
        api.down()
        _, problem = wait_for(lambda: (c := _kubernetes_check(daemon))[0] == 503 and c, timeout=20)
        assert problem is not None and problem.startswith("API server: ")
        api.up()
        assert wait_for(lambda: _kubernetes_check(daemon) == (200, "ok"), timeout=20)
    finally:
        daemon.close()


def test_readyz_has_no_kubernetes_check_on_bare_metal(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        assert wait_for(lambda: daemon.http.get("/readyz").status_code == 200, timeout=20)
        assert "kubernetes" not in daemon.http.get("/readyz").json()["checks"]
    finally:
        daemon.close()
