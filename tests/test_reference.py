"""docs/REFERENCE.md names every setting and every route: the checks find them by walking the
code (the Settings dataclass, what load_settings reads, the URL maps of the shop and of the
sandbox), so adding one without documenting it fails here with its name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from shop import create_app
from shop.settings import Settings, load_settings
from shop.stripe_sandbox import create_sandbox_app

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "REFERENCE.md"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# `GET /orders/<ref>`, `GET/POST /console/login`, `DELETE /v1/webhook_endpoints/{id}`: a method
# (or several joined by "/") and a path, inside backticks.
DOCUMENTED_ROUTE = re.compile(r"`((?:%s)(?:/(?:%s))*) (/[^`\s]*)`" % ("|".join(METHODS), "|".join(METHODS)))


def section(text: str, title: str) -> str:
    """The body of one `## title` section, up to the next level-2 heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/REFERENCE.md has no '## {title}' section"
    return match.group(1)


def normalise_path(path: str) -> str:
    """Converters and placeholder names do not matter, only where a variable part sits:
    `/orders/<reference>`, `/orders/<ref>`, `/x/<int:id>`, `/x/<work:w>`, `/x/{id}` all become
    `/orders/<>` etc. A query string written after the path is dropped."""
    path = path.split("?", 1)[0]
    return re.sub(r"<[^>]*>|\{[^}]*\}", "<>", path)


def documented_routes(text: str) -> set[tuple[str, str]]:
    found = set()
    for methods, path in DOCUMENTED_ROUTE.findall(text):
        for method in methods.split("/"):
            found.add((method, normalise_path(path)))
    return found


def undocumented_routes(app, text: str) -> list[str]:
    """Every (method, rule) of the app, except static files, missing from `text`."""
    documented = documented_routes(text)
    missing = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            if (method, normalise_path(rule.rule)) not in documented:
                missing.append(f"{method} {rule.rule}")
    return sorted(missing)


class _RecordingEnv(dict):
    """An environment that notes every variable name load_settings asks for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.asked.add(key)
        return super().__contains__(key)


def setting_names(tmp_path) -> set[str]:
    """The settings as the code declares them: each field of the Settings dataclass (as its
    config key) and each environment variable load_settings reads."""
    env = _RecordingEnv(SECRET_KEY="reference-test")
    load_settings(env, str(tmp_path), argv=["gunicorn"])
    return {f.name.upper() for f in dataclasses.fields(Settings)} | env.asked


def undocumented_settings(names, text: str) -> list[str]:
    return sorted(name for name in names if f"`{name}`" not in text)


@pytest.fixture(scope="module")
def reference() -> str:
    return REFERENCE.read_text(encoding="utf-8")


@pytest.fixture
def shop_app(tmp_path):
    return create_app({"SECRET_KEY": "reference-test", "DATABASE_URL": f"sqlite:///{tmp_path}/reference.sqlite3"})


def test_every_setting_is_in_the_reference_settings_section(reference, tmp_path):
    names = setting_names(tmp_path)
    assert "UNPAID_ORDER_EXPIRY_SECONDS" in names and "SECRET_KEY_EPHEMERAL" in names  # the walk works
    missing = undocumented_settings(names, section(reference, "Settings"))
    assert not missing, f"settings missing from docs/REFERENCE.md, Settings: {', '.join(missing)}"


def test_every_shop_route_is_in_the_reference_routes_section(reference, shop_app):
    missing = undocumented_routes(shop_app, section(reference, "Routes"))
    assert not missing, f"routes missing from docs/REFERENCE.md, Routes: {', '.join(missing)}"


def test_every_sandbox_route_is_in_the_reference_sandbox_section(reference):
    sandbox_app = create_sandbox_app(start_threads=False)
    try:
        missing = undocumented_routes(sandbox_app, section(reference, "Sandbox"))
    finally:
        sandbox_app.extensions["stripe_sandbox"].close()
    assert not missing, f"sandbox routes missing from docs/REFERENCE.md, Sandbox: {', '.join(missing)}"


def test_a_route_added_without_documentation_is_named_with_its_converter(reference, shop_app):
    """The walk is not a list kept by hand: a new rule, whatever its converters, is found."""
    shop_app.add_url_rule(
        "/orders/<reference>/gift/<int:line>", "gift", lambda reference, line: "", methods=["GET", "POST"]
    )
    shop_app.add_url_rule("/console/outbox/<work:work>/inspect", "inspect", lambda work: "")
    missing = undocumented_routes(shop_app, section(reference, "Routes"))
    assert missing == [
        "GET /console/outbox/<work:work>/inspect",
        "GET /orders/<reference>/gift/<int:line>",
        "POST /orders/<reference>/gift/<int:line>",
    ]


def test_a_documented_route_matches_whatever_its_placeholders_are_called():
    text = "`GET /orders/<ref>` and `GET/POST /console/login` and `DELETE /v1/things/{id}` `GET /a?b=1`"
    assert documented_routes(text) == {
        ("GET", "/orders/<>"),
        ("GET", "/console/login"),
        ("POST", "/console/login"),
        ("DELETE", "/v1/things/<>"),
        ("GET", "/a"),
    }
    assert normalise_path("/cart/items/<id:variant_id>/delete") == "/cart/items/<>/delete"


def test_a_setting_added_without_documentation_is_named(reference, tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Grown(Settings):
        checkout_banner_text: str = ""

    names = {f.name.upper() for f in dataclasses.fields(Grown)}
    missing = undocumented_settings(names, section(reference, "Settings"))
    assert missing == ["CHECKOUT_BANNER_TEXT"]
