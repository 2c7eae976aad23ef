"""deploy/: the Prometheus alert rules and the Grafana dashboard name only metrics the
exporter serves, and every alert has its section in docs/runbook.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.unit.test_docs import _anchors
from workers import metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "onward.json"
RUNBOOK = ROOT / "docs" / "runbook.md"
_NAME = re.compile(r"\b(onward_[a-z_]+)")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _served() -> set[str]:
    """Every family name the exporter's code declares, with the sample suffixes."""
    source = Path(metrics.__file__).read_text()
    names = set(re.findall(r'"(onward_[a-z_]+)"', source))
    return names | {n + s for n in names for s in _SUFFIXES}


def _rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_deploy__alerts_name_served_metrics_and_have_a_runbook_section() -> None:
    """Each alert's expression names metrics the exporter serves; its runbook_url points
    at a heading of docs/runbook.md."""
    served, anchors = _served(), _anchors(RUNBOOK)
    rules = _rules()
    assert len(rules) >= 10
    for rule in rules:
        unknown = set(_NAME.findall(str(rule["expr"]))) - served
        assert not unknown, f"{rule['alert']}: {unknown}"
        url = rule["annotations"]["runbook_url"]  # type: ignore[index]
        assert url == f"docs/runbook.md#{str(rule['alert']).lower()}"
        assert str(rule["alert"]).lower() in anchors, f"no runbook section for {rule['alert']}"


def test_deploy__dashboard_queries_served_metrics() -> None:
    """Every panel of the Grafana dashboard queries metrics the exporter serves."""
    dashboard = json.loads(DASHBOARD.read_text())
    served = _served()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    for expr in exprs:
        assert set(_NAME.findall(expr)) <= served, expr
