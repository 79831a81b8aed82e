"""PromQL as the chart's queries use it, checked against a real server's /metrics:
what each selector names (metric and label matchers) and what the server exports.
Shared by the dashboard's and the alerts' tests."""

from __future__ import annotations

import urllib.request
from collections import defaultdict

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

# Grafana's variables, given values so that the queries parse as plain PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": "default", "$pod": ".*"}
# Labels whose values a query names and the server must export: Triton's quantiles and
# failure reasons (the others are Prometheus's own: namespace, pod, or regexes).
CHECKED_LABELS = ("quantile", "reason")


def parse(expr: str):
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return promql_parser.parse(expr)


def selectors(node) -> list[tuple[str, dict[str, str]]]:
    """(metric, {label: value} of its equality matchers) of every selector in a parsed expression."""
    if type(node).__name__ == "VectorSelector":
        equal = {m.name: m.value for m in node.matchers.matchers if m.op == promql_parser.MatchOp.Equal}
        return [(node.name, equal)]
    found = []
    for attribute in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
        child = getattr(node, attribute, None)
        for each in child if isinstance(child, list) else [child]:
            if type(each).__module__ == "promql_parser":
                found += selectors(each)
    return found


def metric_names(node) -> set[str]:
    return {name for name, _ in selectors(node)}


def exported_series(metrics_url: str) -> dict[str, dict[str, set[str]]]:
    """metric family -> label -> the values the server exports (a summary's samples
    under its family's name, quantiles included)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    exported: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        labels = exported.setdefault(family.name, defaultdict(set))
        for sample in family.samples:
            for label, value in sample.labels.items():
                labels[label].add(value)
    return exported


def unexported(expr: str, exported: dict[str, dict[str, set[str]]], ignore: set[str] = frozenset()) -> list[str]:
    """What `expr` names that the server does not export: metrics, and the values of
    CHECKED_LABELS its selectors match."""
    missing = []
    for name, labels in selectors(parse(expr)):
        if name in ignore:
            continue
        if name not in exported:
            missing.append(name)
            continue
        for label in CHECKED_LABELS:
            if label in labels and labels[label] not in exported[name].get(label, set()):
                missing.append(f'{name}{{{label}="{labels[label]}"}}')
    return missing
