"""The API's edges as a client meets them: a body not sent as JSON, the OpenAPI description
listing only answers a route can give, no page that needs the internet; and the daemon's log:
UTC ISO 8601 times, a JSON form, misspelled variables named at start."""

import json
import logging
import re
import sys
from pathlib import Path

import pytest
from vgpu_hypervisor.daemon.log_format import JsonFormatter, TextFormatter, formatter

from .conftest import Daemon, wait_for

BODY = b'{"name": "p", "gpus": {"0": {"memory": "1GiB"}}}'
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({}, "no Content-Type"),
        ({"Content-Type": "text/plain"}, "'text/plain'"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, "x-www-form-urlencoded"),
    ],
)
def test_a_body_not_sent_as_json_is_a_415_naming_what_came(
    daemon: Daemon, headers: dict[str, str], named: str
) -> None:
    for method, path in (("POST", "/api/v1/pods"), ("PATCH", "/api/v1/pods/default/p")):
        reply = daemon.api(method, path, content=BODY, headers=headers)
        assert reply.status_code == 415, reply.text
        message = reply.json()["error"]
        assert "\n" not in message
        assert "Content-Type: application/json" in message
        assert named in message
    assert daemon.api("GET", "/api/v1/pods").json() == []  # nothing was created


def test_json_with_a_charset_or_a_json_suffix_is_json(daemon: Daemon) -> None:
    for number, content_type in enumerate(
        ("application/json; charset=utf-8", "application/merge-patch+json")
    ):
        body = BODY.replace(b'"p"', f'"p{number}"'.encode())
        reply = daemon.api(
            "POST", "/api/v1/pods", content=body, headers={"Content-Type": content_type}
        )
        assert reply.status_code == 201, reply.text


def test_a_key_given_twice_in_a_json_object_is_a_422(daemon: Daemon) -> None:
    """json keeps the last: a GPU given twice got the second limit, the first dropped without a
    word (the limiter and the CLI refuse the same thing)."""
    twice = b'{"name": "x", "gpus": {"0": {"memory": 1}, "0": {"memory": 2}}}'
    headers = {"Content-Type": "application/json"}
    reply = daemon.api("POST", "/api/v1/pods", content=twice, headers=headers)
    assert reply.status_code == 422, reply.text
    assert reply.json() == {"error": "the JSON body gives the key '0' twice in one object"}
    assert daemon.api("GET", "/api/v1/pods").json() == []
    nested = b'{"name": "x", "gpus": {"0": {"memory": "1GiB", "memory": "2GiB"}}}'
    reply = daemon.api("POST", "/api/v1/pods", content=nested, headers=headers)
    assert reply.status_code == 422 and "'memory' twice" in reply.json()["error"]
    once = b'{"name": "x", "gpus": {"0": {"memory": "1GiB"}, "1": {"memory": "1GiB"}}}'
    assert daemon.api("POST", "/api/v1/pods", content=once, headers=headers).status_code == 201


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"name": "p", "weight": ' + b"9" * 5000 + b"}", "a number of more than 4300 digits"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (BODY.decode().encode("utf-16"), "not UTF-8 (byte 0xff at offset 0)"),
        (b'{"name": "\xe9"}', "not UTF-8 (byte 0xe9 at offset 10)"),
        # Without its byte order mark, UTF-16 is valid UTF-8 with a NUL after each character:
        # FastAPI's json.loads guessed UTF-16 from the NULs and took it.
        (BODY.decode().encode("utf-16-le"), "Expecting property name enclosed in double quotes"),
    ],
    ids=["long-number", "deep", "utf-16", "latin-1", "utf-16-le"],
)
def test_a_body_that_is_no_json_the_api_reads_is_a_422_naming_why(
    daemon: Daemon, body: bytes, why: str
) -> None:
    """These answered 400 {"error": "There was an error parsing the body"}, which named nothing
    and is in no route's OpenAPI answers (the last one was taken as a pod)."""
    headers = {"Content-Type": "application/json"}
    for method, path in (("POST", "/api/v1/pods"), ("PATCH", "/api/v1/pods/default/p")):
        reply = daemon.api(method, path, content=body, headers=headers)
        assert reply.status_code == 422, reply.text
        assert reply.json() == {"error": f"the body is not valid JSON: {why}"}
    assert daemon.api("GET", "/api/v1/pods").json() == []
    marked = b"\xef\xbb\xbf" + BODY  # UTF-8 with a byte order mark is taken, as before
    assert daemon.api("POST", "/api/v1/pods", content=marked, headers=headers).status_code == 201


def test_a_path_with_a_trailing_slash_is_a_404_not_a_redirect(daemon: Daemon) -> None:
    """/api/v1/pods/ answered 307 with a Location built from the Host header."""
    for method, path in (("GET", "/api/v1/pods/"), ("POST", "/api/v1/pods/"), ("GET", "/healthz/")):
        reply = daemon.api(method, path, headers={"Host": "evil.example"}, json={})
        assert reply.status_code == 404, reply.text
        assert "location" not in reply.headers
        assert reply.json() == {"error": f"no such endpoint: {method} {path}"}


def test_a_memory_limit_written_as_a_whole_float_is_taken(daemon: Daemon) -> None:
    """JSON has one kind of number, and the schema's integer allows 1073741824.0: a client that
    computes its sizes (Python's json writes 2**30 / 1 so) had it refused."""
    headers = {"Content-Type": "application/json"}
    whole = b'{"name": "f", "gpus": {"0": {"memory": 1073741824.0}}}'
    reply = daemon.api("POST", "/api/v1/pods", content=whole, headers=headers)
    assert reply.status_code == 201, reply.text
    assert daemon.api("GET", "/api/v1/pods/default/f").json()["gpus"][0]["memory_limit"] == 1 << 30
    part = b'{"name": "g", "gpus": {"0": {"memory": 1073741824.5}}}'
    reply = daemon.api("POST", "/api/v1/pods", content=part, headers=headers)
    assert reply.status_code == 422 and "bytes" in reply.json()["error"]


def test_openapi_lists_only_the_answers_each_route_can_give(daemon: Daemon) -> None:
    spec = daemon.http.get("/openapi.json").json()
    answers = {
        (method.upper(), path): set(operation["responses"])
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
    }
    assert answers[("GET", "/healthz")] == {"200"}
    assert answers[("GET", "/readyz")] == {"200", "503"}
    assert answers[("GET", "/metrics")] == {"200", "401"}
    assert answers[("GET", "/api/v1/status")] == {"200", "401"}
    assert answers[("GET", "/api/v1/pods/{namespace}/{name}")] == {"200", "401", "404", "422"}
    assert answers[("POST", "/api/v1/pods")] == {"201", "401", "409", "415", "422"}
    for (method, path), codes in answers.items():
        if method == "GET":
            assert not codes & {"409", "415"}, (method, path)
            # Reads need the token too, but the probes and the document itself.
            assert ("401" in codes) == (path not in ("/healthz", "/readyz")), (method, path)
    # Every error is our one-line document, never FastAPI's own validation schema.
    error_document = {"$ref": "#/components/schemas/ErrorDocument"}
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            for code, answer in operation["responses"].items():
                if code.startswith("4"):
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == error_document, (path, code)
    assert "HTTPValidationError" not in spec.get("components", {}).get("schemas", {})


def test_no_page_loads_from_the_internet(daemon: Daemon) -> None:
    # /docs and /redoc would load Swagger UI and ReDoc from a CDN: they are not served.
    for page in ("/docs", "/redoc"):
        assert daemon.http.get(page).status_code == 404
    served = daemon.http.get("/openapi.json")
    assert served.status_code == 200
    assert "cdn" not in served.text.lower()


def test_log_lines_carry_utc_iso_8601_times(daemon: Daemon) -> None:
    lines = wait_for(lambda: daemon.log_file.read_text().splitlines())
    assert lines and all(ISO_UTC.match(line) for line in lines), lines


def test_the_json_log_format_and_a_misspelled_variable(tmp_path: Path) -> None:
    running = Daemon(tmp_path, extra=("--log-format", "json"))
    running.environment["TF_HYPERVISOR_SAMPLE_INTERVALS"] = "5"
    running.start()
    try:
        lines = wait_for(lambda: running.log_file.read_text().splitlines())
    finally:
        running.close()
    records = [json.loads(line) for line in lines]
    assert all(set(record) == {"time", "level", "logger", "message"} for record in records)
    assert all(ISO_UTC.match(record["time"] + " ") for record in records)
    first = records[0]
    assert first["level"] == "WARNING"
    assert first["message"] == (
        "TF_HYPERVISOR_SAMPLE_INTERVALS is not a tf-hypervisor setting; ignored "
        "(did you mean TF_HYPERVISOR_SAMPLE_INTERVAL_S?)"
    )
    assert any(record["message"].startswith("GPU backend:") for record in records)


def test_a_bad_log_format_is_one_line_naming_it(daemon: Daemon) -> None:
    done = daemon.cli("daemon", "--log-format", "xml", "--config", "")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --log-format=xml: expected text or json"]


def test_formatters_keep_one_record_on_one_line() -> None:
    try:
        raise ValueError("two\nlines")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "f", 1, "bad %s", ("a\nb",), sys.exc_info())
    record.created = 0.0
    document = JsonFormatter().format(record)
    assert "\n" not in document
    parsed = json.loads(document)
    assert parsed["time"] == "1970-01-01T00:00:00.000Z"
    assert parsed["message"] == "bad a\nb"
    assert "ValueError: two" in parsed["exception"]
    text = TextFormatter().format(record)
    assert text.startswith("1970-01-01T00:00:00.000Z ERROR x: bad a")
    assert isinstance(formatter("json"), JsonFormatter)
    assert isinstance(formatter("text"), TextFormatter)


def test_a_query_parameter_is_given_once_and_only_one_the_route_takes(daemon: Daemon) -> None:
    """Starlette keeps the last of a repeated parameter and drops an unknown one: `freeze?gpu=
    0&gpu=1` froze GPU 1 alone, `pods?namesapce=team` listed every namespace."""
    body = {"name": "q", "gpus": {"0": {"compute": 30}, "1": {"compute": 30}}}
    assert daemon.api("POST", "/api/v1/pods", json=body).status_code == 201
    cases = [
        ("POST", "/api/v1/pods/default/q/freeze?gpu=0&gpu=1", "query.gpu: given twice"),
        ("GET", "/api/v1/pods?namespace=a&namespace=default", "query.namespace: given twice"),
        ("DELETE", "/api/v1/pods/default/q?force=false&force=true", "query.force: given twice"),
        ("GET", "/api/v1/pods?namesapce=team", "query.namesapce: not a parameter"),
        ("GET", "/api/v1/workers?pods=q", "query.pods: not a parameter"),
        # Named back in one line of visible text (the fuzzer's: a newline as the name).
        ("GET", "/api/v1/pods?%0A%1B=1", "query.\\x0a\\x1b: not a parameter"),
    ]
    for method, path, error in cases:
        reply = daemon.api(method, path)
        assert reply.status_code == 422, (path, reply.text)
        assert reply.json()["error"].startswith(error), reply.text
    pod = daemon.api("GET", "/api/v1/pods/default/q").json()
    assert not pod["frozen"] and not any(gpu["frozen"] for gpu in pod["gpus"])
    # Routes without parameters ignore any: a scrape configuration's params reach /metrics.
    assert daemon.api("GET", "/metrics?format=text").status_code == 200
    assert daemon.api("GET", "/api/v1/pods?namespace=default").status_code == 200
    assert daemon.api("GET", "/api/v1/nosuch?x=1&x=2").status_code == 404
