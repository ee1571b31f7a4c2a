"""`pods create --owner`: the pod's region belongs to the user (or group) who runs its programs."""

import os
import stat

import pytest
from pydantic import ValidationError
from vgpu_hypervisor.models import PodCreate, PodUpdate, first_problem

from tests.hypervisor.conftest import Daemon


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_the_region_belongs_to_the_pods_owner(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "mine", "--mem", "0=1GiB", "--owner", "65534:65534")
    assert created.returncode == 0, created.stderr
    folder = daemon.base / "default" / "mine"
    region = (folder / "shm").stat()
    assert (region.st_uid, region.st_gid, stat.S_IMODE(region.st_mode)) == (65534, 65534, 0o660)
    # The folder is the daemon's: the tenant cannot remove or replace its region.
    info = folder.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 65534, 0o755)


def test_a_group_alone_keeps_the_daemons_user(daemon: Daemon) -> None:
    created = daemon.cli("pods", "create", "shared", "--mem", "0=1GiB", "--owner", ":0")
    assert created.returncode == 0, created.stderr
    info = (daemon.base / "default" / "shared" / "shm").stat()
    assert (info.st_uid, info.st_gid) == (os.geteuid(), 0)


@pytest.mark.parametrize(
    ("value", "words"),
    [("no-such-user-here", "no user 'no-such-user-here'"), (":", "expected USER, USER:GROUP")],
)
def test_a_bad_owner_is_one_line(daemon: Daemon, value: str, words: str) -> None:
    created = daemon.cli("pods", "create", "p", "--mem", "0=1GiB", "--owner", value)
    assert created.returncode == 2
    assert words in created.stderr and created.stderr.count("\n") == 1


@pytest.mark.parametrize("field", ["owner", "group", "weight"])
@pytest.mark.parametrize("value", [True, False, "5", "0", 5.5, [5]])
def test_an_id_or_a_weight_is_a_json_integer_and_nothing_else(field: str, value: object) -> None:
    """pydantic's lax mode took true as 1 (an owner of true gave the region to uid 1) and "5"
    as 5."""
    body = {"name": "p", "gpus": {"0": {}}, field: value}
    with pytest.raises(ValidationError) as raised:
        PodCreate.model_validate(body)
    assert (
        first_problem(raised.value.errors(), "body") == f"{field}: Input should be a valid integer"
    )
    if field == "weight":
        with pytest.raises(ValidationError):
            PodUpdate.model_validate({field: value})


def test_an_id_or_a_weight_may_be_written_as_a_whole_float() -> None:
    """JSON has one kind of number, as for a memory size."""
    pod = PodCreate.model_validate({"name": "p", "gpus": {"0": {}}, "owner": 1000.0, "weight": 4})
    assert (pod.owner, pod.weight) == (1000, 4) and isinstance(pod.owner, int)
    assert PodUpdate.model_validate({"weight": None}).weight is None


def test_the_api_refuses_an_owner_of_true_in_one_line(daemon: Daemon) -> None:
    reply = daemon.api("POST", "/api/v1/pods", json={"name": "p", "gpus": {"0": {}}, "owner": True})
    assert reply.status_code == 422
    assert reply.json() == {"error": "owner: Input should be a valid integer"}
    assert not (daemon.base / "default" / "p").exists()
    daemon.api("POST", "/api/v1/pods", json={"name": "p", "gpus": {"0": {}}})
    reply = daemon.api("PATCH", "/api/v1/pods/default/p", json={"weight": "5"})
    assert reply.status_code == 422
    assert reply.json() == {"error": "weight: Input should be a valid integer"}
