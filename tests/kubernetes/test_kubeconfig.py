"""The API server's client configuration: a list of kubeconfig files merged as kubectl merges
them (checked against real kubectl), and each malformed file said in one line."""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube.config.kubeconfig import SingleConfig
from vgpu_hypervisor.kubernetes.kubeconfig import KubeConfigError, load
from vgpu_hypervisor.kubernetes.setup import KubernetesSetupError, open_client
from vgpu_hypervisor.settings import Settings

from tests.kubernetes.conftest import needs_kubectl, run_kubectl
from tests.support.apiserver import ApiServer


def cluster(name: str, server: str, **fields: str) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": server, **fields}}


def user(name: str, token: str, **fields: str) -> dict[str, Any]:
    return {"name": name, "user": {"token": token, **fields}}


def context(name: str, cluster_name: str, user_name: str) -> dict[str, Any]:
    return {"name": name, "context": {"cluster": cluster_name, "user": user_name}}


def write(path: Path, **document: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **document}))
    return path


def listed(*paths: Path) -> str:
    return os.pathsep.join(map(str, paths))


def chosen(where: str | Path | None) -> SingleConfig:
    """The configuration a client of `where` uses: its current context's."""
    one = load(where).get()
    assert one is not None
    return one


def test_the_first_file_to_name_an_entry_or_the_current_context_wins(tmp_path: Path) -> None:
    first = write(
        tmp_path / "first",
        clusters=[cluster("shared", "https://first:6443")],
        users=[user("admin", "first-token")],
    )
    second = write(
        tmp_path / "second",
        **{"current-context": "work"},
        clusters=[cluster("shared", "https://second:6443"), cluster("only", "https://only:6443")],
        users=[user("admin", "second-token")],
        contexts=[context("work", "shared", "admin"), context("other", "only", "admin")],
    )
    third = write(tmp_path / "third", **{"current-context": "other"})
    one = chosen(listed(first, tmp_path / "missing", second, third))
    assert one.context_name == "work"
    assert one.cluster.server == "https://first:6443"
    assert one.user is not None and one.user.token == "first-token"


def test_relative_paths_are_relative_to_the_file_that_names_them(tmp_path: Path) -> None:
    (tmp_path / "a" / "certs").mkdir(parents=True)
    (tmp_path / "a" / "certs" / "ca.crt").write_text("not read here")
    first = write(tmp_path / "a" / "config", clusters=[cluster("c", "https://c:6443",
                  **{"certificate-authority": "certs/ca.crt"})])  # fmt: skip
    second = write(
        tmp_path / "b" / "config",
        **{"current-context": "x"},
        users=[user("u", "t", **{"client-key": "keys/u.key"})],
        contexts=[context("x", "c", "u")],
    )
    one = chosen(listed(second, first))
    assert one.cluster.certificate_auth == str(tmp_path / "a" / "certs" / "ca.crt")
    assert one.user is not None and one.user.client_key == str(tmp_path / "b" / "keys" / "u.key")


@needs_kubectl
def test_a_list_reaches_the_api_server_as_kubectl_does(tmp_path: Path, api: ApiServer) -> None:
    # The stand-in's own file is split in two, with a decoy cluster of the same name after it:
    # the daemon's client and kubectl must both pick the stand-in.
    whole = json.loads(api.kubeconfig(tmp_path / "whole").read_text())
    credentials = write(tmp_path / "credentials", clusters=whole["clusters"], users=whole["users"])
    contexts = write(
        tmp_path / "contexts",
        **{"current-context": "test"},
        clusters=[cluster("test", "https://decoy.invalid:6443")],
        contexts=whole["contexts"],
    )
    files = listed(credentials, contexts)
    shown = run_kubectl(Path(files), tmp_path, "config", "view", "--minify", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["clusters"][0]["cluster"]["server"] == api.url
    listed_pods = run_kubectl(Path(files), tmp_path, "get", "pods", "-A", "-o", "name")
    assert listed_pods.returncode == 0, listed_pods.stderr

    settings = Settings(kubeconfig=Path(files))
    assert chosen(settings.kubeconfig).cluster.server == api.url


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("clusters: [1\n", "is not YAML at line 2: expected ',' or ']', but got '<stream end>'"),
        ("- 1\n- 2\n", "is not a kubeconfig: a list"),
        ("clusters: 5\n", ": clusters is not a list"),
        ("clusters: [5]\n", ": each of clusters needs a name and a cluster mapping"),
        ("users:\n- name: u\n  user: token\n", ": each of users needs a name and a user mapping"),
        ("contexts:\n- context: {cluster: c}\n", ": each of contexts needs a name and a context"),
        ("current-context: x\n", ": Context 'x' not found"),
        ("", ": No current context set and no default provided"),
    ],
)
def test_each_malformed_file_is_one_line_naming_it(tmp_path: Path, text: str, said: str) -> None:
    # Before, the daemon ended in a traceback of lightkube's for each of the first six.
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubernetesSetupError) as raised:
        open_client(Settings(kubeconfig=path))
    message = str(raised.value)
    assert message.startswith(f"cannot read the Kubernetes config: {path}")
    assert said in message
    assert "\n" not in message


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"^\S+/alone not found$"):
        load(tmp_path / "alone")
    with pytest.raises(KubeConfigError, match=r"^none of \S+/a, \S+/b exists$"):
        load(listed(tmp_path / "a", tmp_path / "b"))
    with pytest.raises(KubeConfigError, match="is not UTF-8 text"):
        (tmp_path / "binary").write_bytes(b"\xff\xfe")
        load(tmp_path / "binary")
