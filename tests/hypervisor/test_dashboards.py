"""The Grafana dashboard and the Prometheus alerts name only series the daemon exports.

The names come out of each PromQL expression by a small tokenizer (strings, label matchers,
ranges, numbers, Grafana variables, functions, keywords and grouping label lists are not
metric names); the exported names from a live /metrics of a daemon on the simulated GPU, by
family, so a series without samples at the moment (XID counts, a pod's limit) still counts.
"""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Daemon

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "vgpu-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"

# Series Prometheus itself makes for every scrape target.
PROMETHEUS_OWN = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
# Announced pod series from the regions' counters, referred to before the daemon exports them.
ANNOUNCED: frozenset[str] = frozenset()

_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2", "start", "end"}
)
_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk"}
    | {"topk", "quantile", "limitk", "limit_ratio"}
)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?)([smhdwy]|ms)?")
_VARIABLE = re.compile(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def _skip_to(text: str, start: int, close: str) -> int:
    """The index after the ``close`` that ends the bracket opened before ``start`` (strings
    inside are skipped)."""
    position = start
    while position < len(text):
        char = text[position]
        if char in "\"'`":
            position = text.index(char, position + 1) + 1
            continue
        if char == close:
            return position + 1
        position += 1
    raise ValueError(f"unclosed {close!r} in {text!r}")


def metric_names(expression: str) -> set[str]:  # noqa: PLR0912 (one branch per kind of token)
    """The metric names a PromQL expression reads."""
    names: set[str] = set()
    position = 0
    expect_grouping = False
    while position < len(expression):
        char = expression[position]
        if char.isspace():
            position += 1
        elif char in "\"'`":
            position = expression.index(char, position + 1) + 1
        elif char == "{":
            position = _skip_to(expression, position + 1, "}")
        elif char == "[":
            position = _skip_to(expression, position + 1, "]")
        elif char == "(" and expect_grouping:
            position = _skip_to(expression, position + 1, ")")
            expect_grouping = False
        elif (variable := _VARIABLE.match(expression, position)) is not None:
            position = variable.end()
        elif char.isdigit() or (char == "." and expression[position + 1 : position + 2].isdigit()):
            number = _NUMBER.match(expression, position)
            assert number is not None
            position = number.end()
        elif (word := _IDENTIFIER.match(expression, position)) is not None:
            name = word.group()
            position = word.end()
            rest = expression[position:].lstrip()
            if name.lower() in _GROUPING:
                expect_grouping = True
            elif name.lower() in _KEYWORDS or rest.startswith("("):
                pass  # an operator, or a function / aggregation
            elif name in _AGGREGATIONS and re.match(r"(by|without)\b", rest):
                pass  # sum by (...) (...)
            else:
                names.add(name)
        else:
            position += 1
    return names


def _dashboard_queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            # "query" is also a variable's plain name or an object: only a call is PromQL
            promql = key in ("expr", "definition") or (key == "query" and "(" in str(value))
            if promql and isinstance(value, str):
                yield value
            else:
                yield from _dashboard_queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_queries(item)


def dashboard_queries() -> list[str]:
    return list(_dashboard_queries(json.loads(DASHBOARD.read_text())))


def alert_expressions() -> list[str]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


def exported_names(exposition: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(sample.name for sample in family.samples)
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("up", {"up"}),
        ('sum by (namespace, pod) (rate(a_total{job="x", pod=~"$pod"}[5m]))', {"a_total"}),
        ("a / on(UUID) group_left(modelName) b * 100 > bool 0.5e3", {"a", "b"}),
        ('time() - c offset 5m > 60 and d{x="{y}"} unless e[1h:5m]', {"c", "d", "e"}),
        ('label_values(f{Hostname=~"$Hostname"}, namespace)', {"f", "namespace"}),
        ("increase(g[$__rate_interval]) or vector(0)", {"g"}),
        ("max without(gpu) (h) * ${factor}", {"h"}),
    ],
)
def test_the_tokenizer_finds_the_metric_names(expression: str, expected: set[str]) -> None:
    assert metric_names(expression) == expected


def test_the_deploy_files_are_what_grafana_and_prometheus_read() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all("gridPos" in panel for panel in dashboard["panels"])
    assert len(dashboard_queries()) > 20
    rules = [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]
    assert {rule["alert"] for rule in rules} >= {
        "VgpuDaemonDown",
        "VgpuPodAtMemoryLimit",
        "VgpuPodThrottled",
        "VgpuPodRegionError",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"]


def test_every_query_and_alert_names_a_series_the_daemon_exports(daemon: Daemon) -> None:
    exported = exported_names(daemon.http.get("/metrics").text)
    assert "tf_gpu_energy_joules_total" in exported
    assert "tf_gpu_xid_errors_total" in exported  # a family without samples on this GPU
    known = exported | PROMETHEUS_OWN | ANNOUNCED
    # label_values(METRIC, LABEL): the label is the second argument, not a metric
    used: dict[str, set[str]] = {}
    for expression in dashboard_queries() + alert_expressions():
        names = metric_names(expression)
        if expression.startswith("label_values("):
            names.discard(expression.rstrip(") ").rsplit(",", 1)[1].strip())
        for name in names:
            used.setdefault(name, set()).add(expression)
    unknown = {name: sorted(where) for name, where in used.items() if name not in known}
    assert not unknown, f"not exported by the daemon: {unknown}"
    # The dashboard shows every exported tf_* series somewhere.
    missing = {n for n in exported if n.startswith("tf_") and n not in used}
    assert not missing, f"exported but on no panel: {sorted(missing)}"
