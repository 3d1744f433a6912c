"""The alerts that ship (deploy/prometheus/alerts.yml) and the dashboard beside them
(deploy/grafana/backstop.json): promtool checks the rules and runs their unit tests
(deploy/prometheus/alerts_test.yml), and every shop_ metric they name must be one the shop's
/metrics really exposes, so a renamed or dropped metric fails here instead of silently never
alerting."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from support import leave_heartbeats

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "backstop.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not found: it comes with Debian's `prometheus` package (scripts/test installs it)",
)
METRIC = re.compile(r"\bshop_[a-z_]+\b")
# The header of alerts.yml: the console_url external label, else PUBLIC_BASE_URL's default.
CONSOLE_BASE = "{{ with $externalLabels.console_url }}{{ . }}{{ else }}http://127.0.0.1:5000{{ end }}"
CONSOLE_LINK = re.compile(re.escape(CONSOLE_BASE) + r"(/console/.*)$")


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def rule_tests() -> list[dict]:
    return yaml.safe_load(RULE_TESTS.read_text())["tests"]


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@needs_promtool
def test_promtool_check_rules_accepts_the_rules():
    done = promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    # promtool counts what it read; the YAML read here must agree, or the checks below miss rules.
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout + done.stderr


@needs_promtool
def test_promtool_unit_tests_of_every_rule_pass():
    done = promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_every_rule_is_unit_tested_firing_and_not_firing():
    firing, quiet = set(), set()
    for case in rule_tests():
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "two rules share a name"
    assert not set(names) - firing, f"rules never shown firing: {sorted(set(names) - firing)}"
    assert not set(names) - quiet, f"rules never shown not firing: {sorted(set(names) - quiet)}"
    assert not (firing | quiet) - set(names), (
        f"tests of rules that do not exist: {sorted((firing | quiet) - set(names))}"
    )


def test_every_rule_says_what_to_do_with_a_severity_and_a_console_link(shop_app):
    console_rules = {normalise(rule.rule) for rule in shop_app.url_map.iter_rules() if "GET" in rule.methods}
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        notes = rule["annotations"]
        assert notes["summary"].strip() and len(notes["description"]) > 150, name
        assert "First:" in notes["description"], f"{name}: the description must say what to do first"
        link = CONSOLE_LINK.match(notes["console"])
        assert link, f"{name}: console link not built from console_url: {notes['console']}"
        path = urlsplit(link.group(1)).path
        assert normalise(path) in console_rules, f"{name}: {path} is no console page"


def normalise(path: str) -> str:
    return re.sub(r"<[^>]*>", "<>", path)


@pytest.fixture
def shop_app(tmp_path):
    from shop import create_app

    return create_app({"SECRET_KEY": "alerts-test", "DATABASE_URL": f"sqlite:///{tmp_path}/alerts.sqlite3"})


@pytest.fixture
def exposed(fresh_app) -> set[str]:
    """Every metric name the shop's /metrics answers with (the family's and each sample's, so a
    counter counts as `x` and `x_total`), with a worker and a scheduler beating so that the
    families read from Redis have samples too."""
    leave_heartbeats(fresh_app)
    r = fresh_app.test_client().get("/metrics")
    assert r.status_code == 200
    names = set()
    for family in text_string_to_metric_families(r.get_data(as_text=True)):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    assert "shop_orders_stuck" in names and "shop_processes_beating" in names  # the scrape worked
    return names


def test_every_shop_metric_the_rules_use_is_one_metrics_exposes(exposed):
    used = {name for rule in rules() for name in METRIC.findall(rule["expr"])}
    assert len(used) >= 10, used  # the expressions were read
    assert not used - exposed, f"rules use metrics /metrics does not expose: {sorted(used - exposed)}"


def test_the_rule_tests_feed_only_metrics_metrics_exposes(exposed):
    """The unit tests' input series are what the rules are proven against: a series named after a
    metric the shop does not export proves nothing."""
    fed = {
        name
        for case in rule_tests()
        for series in case["input_series"]
        for name in METRIC.findall(series["series"].split("{", 1)[0])
    }
    assert not fed - exposed, f"unit tests feed metrics /metrics does not expose: {sorted(fed - exposed)}"


def dashboard_exprs(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in dashboard_exprs(value)]
    if isinstance(node, list):
        return [e for value in node for e in dashboard_exprs(value)]
    return []


def test_the_dashboard_is_json_whose_queries_use_only_exposed_metrics(exposed):
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["panels"]
    exprs = dashboard_exprs(board)
    assert len(exprs) >= len(board["panels"]) - sum(p["type"] == "row" for p in board["panels"])
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert not used - exposed, f"dashboard uses metrics /metrics does not expose: {sorted(used - exposed)}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "two panels share an id"


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path):
    """Grafana would only say "parse error" on the panel: promtool reads each query as a recording
    rule (with the dashboard's $job variable filled in) and rejects any that is not PromQL."""
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    records = [
        {"record": f"backstop:dashboard_query_{i}", "expr": e.replace("$job", "backstop")} for i, e in enumerate(exprs)
    ]
    check = tmp_path / "dashboard_rules.yml"
    check.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    done = promtool("check", "rules", str(check))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout + done.stderr
