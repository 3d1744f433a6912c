"""docs/OPERATIONS.md, the operator's runbook, stays in step with what ships: every alert in
deploy/prometheus/alerts.yml has its paragraph (with its severity and the console page its link
opens), every line of `flask shop check` its row, and every `flask shop` command it tells an
operator to type exists. It reads files only: no database, Redis or provider is asked."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from shop.cli import shop_cli
from shop.ops.preflight import NAMES
from shop.ops.waiting import WAITING_LIMIT_SECONDS
from shop.queue.beats import STALL_AFTER_SECONDS

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
CONSOLE_LINK = re.compile(r"\{\{ end \}\}(/console/.*)$")


def _text() -> str:
    return OPERATIONS.read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/OPERATIONS.md has no '## {title}' section"
    return match.group(1)


def _alert_paragraphs(text: str) -> dict[str, str]:
    """`**Name** (severity). ...` paragraphs of the Alerts section, by name."""
    paragraphs = {}
    for paragraph in _section(text, "Alerts").split("\n\n"):
        match = re.match(r"\*\*(Backstop\w+)\*\* \((\w+)\)\.", paragraph)
        if match:
            paragraphs[match.group(1)] = paragraph
    return paragraphs


def _page_pattern(link: str) -> re.Pattern:
    """The console page of an alert's link as the runbook writes it: a template part
    (`{{ $labels.status }}`) stands for any `<word>`."""
    parts = re.split(r"\{\{[^}]*\}\}", link)
    return re.compile("`" + "<[a-z]+>".join(re.escape(p) for p in parts) + "`")


def test_every_shipped_alert_has_a_paragraph_with_its_severity_and_console_page():
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    paragraphs = _alert_paragraphs(_text())
    assert len(rules) > 10 and paragraphs, "the walk found the rules and the paragraphs"

    missing = sorted(rule["alert"] for rule in rules if rule["alert"] not in paragraphs)
    assert not missing, f"alerts without a paragraph in docs/OPERATIONS.md, Alerts: {', '.join(missing)}"
    for rule in rules:
        paragraph = paragraphs[rule["alert"]]
        assert f"({rule['labels']['severity']})." in paragraph.splitlines()[0], rule["alert"]
        link = CONSOLE_LINK.search(rule["annotations"]["console"]).group(1)
        if link == "/console/":
            assert "dashboard" in paragraph or "/healthz" in paragraph, rule["alert"]
        else:
            assert _page_pattern(link).search(paragraph), f"{rule['alert']}: its page {link} is not named"
    unknown = sorted(set(paragraphs) - {rule["alert"] for rule in rules})
    assert not unknown, f"docs/OPERATIONS.md describes alerts that do not ship: {', '.join(unknown)}"


def test_the_stall_alerts_and_their_runbook_say_the_pulse_and_the_work_waiting_card_come_first():
    """A stall is seen on the console long before either stall alert fires: the pulse marks a
    process stalled after STALL_AFTER_SECONDS, the "Work waiting" card turns red past
    WAITING_LIMIT_SECONDS. Both alerts' descriptions and runbook paragraphs say so, with the
    code's own figures, not HEALTH_STALE_SECONDS alone."""
    rules = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    paragraphs = _alert_paragraphs(_text())
    for name in ("BackstopNoProcessBeating", "BackstopProcessStalled"):
        for where, text in (
            ("alerts.yml", rules[name]["annotations"]["summary"] + " " + rules[name]["annotations"]["description"]),
            ("OPERATIONS", paragraphs[name]),
        ):
            text = " ".join(text.split())
            assert "pulse" in text and f"{STALL_AFTER_SECONDS} s" in text, (name, where, text)
            assert "Work waiting" in text and f"{WAITING_LIMIT_SECONDS} s" in text, (name, where, text)
            assert "HEALTH_STALE_SECONDS" in text, (name, where, text)


def test_every_line_of_flask_shop_check_has_a_row_saying_what_to_do():
    text = _text()
    rows = set(re.findall(r"^\| `([a-z-]+)` \|", text, re.M))
    assert set(NAMES) <= rows, f"check lines without a row: {', '.join(sorted(set(NAMES) - rows))}"


def test_every_flask_shop_command_the_runbook_names_exists():
    named = set(re.findall(r"flask (?:--app app )?shop ([a-z][a-z-]*)", _text()))
    assert {"check", "prune", "stripe-register-webhook", "worker", "scheduler", "web"} <= named
    unknown = sorted(named - set(shop_cli.commands))
    assert not unknown, f"docs/OPERATIONS.md names commands that do not exist: {', '.join(unknown)}"


def test_the_runbook_is_linked_from_the_readme_and_the_architecture():
    assert "(docs/OPERATIONS.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(OPERATIONS.md)" in (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
