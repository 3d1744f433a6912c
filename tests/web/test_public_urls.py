"""Every absolute URL the shop hands out comes from PUBLIC_BASE_URL, whatever the request's `Host`
or `X-Forwarded-Host` says (docs/REFERENCE.md, Routes, Conventions): pages, JSON, every redirect
(the routing redirects of `//` and of a missing trailing slash included), emails and the URLs
given to the provider. A forged Host must never come back to anyone."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests
from flask.testing import FlaskClient

from payment_helpers import DEFAULT_SKU, HTML, JSON, Shopper, order_id
from shop.emails import render
from shop.extensions import db
from shop.models import Order
from support import log_in

PUBLIC = "http://127.0.0.1:5000"  # base_config's PUBLIC_BASE_URL
FORGED_HOST = "evil.example"
# What a forging client sends: its own Host, and the proxy headers a careless setup would trust.
FORGED = {
    "HTTP_HOST": FORGED_HOST,
    "HTTP_X_FORWARDED_HOST": FORGED_HOST,
    "HTTP_X_FORWARDED_PROTO": "https",
    "HTTP_X_FORWARDED_PREFIX": "/evil",
}


class ForgingClient(FlaskClient):
    """A browser whose every request names the forged host (the test client's own Host comes
    from its base_url, after environ_base, hence the overrides); its cookies are kept for that
    host, so its session works as a browser's would."""

    def open(self, *args, **kwargs):
        kwargs["environ_overrides"] = {**FORGED, **(kwargs.get("environ_overrides") or {})}
        return super().open(*args, **kwargs)


def forged_client(app) -> ForgingClient:
    return ForgingClient(app, app.response_class, use_cookies=True)


def assert_not_forged(location: str | None, what: str, *, provider: str | None = None) -> None:
    """A Location of the shop is relative (a path, never `//host`) or absolute at
    PUBLIC_BASE_URL; the provider's hosted page is the one other address allowed."""
    assert location, f"{what}: no Location"
    assert FORGED_HOST not in location and "/evil" not in location, f"{what}: Location {location!r}"
    if provider and location.startswith(provider):
        return
    if location.startswith(PUBLIC + "/"):
        return
    assert location.startswith("/") and not location.startswith(("//", "/\\")), f"{what}: Location {location!r}"
    assert not urlsplit(location).netloc, f"{what}: Location {location!r}"


def path_request(client, method: str, path: str, **kwargs):
    """A request for a raw path (the test client would read `//console` as a host named console)."""
    return client.open("/", method=method, environ_overrides={**FORGED, "PATH_INFO": path}, **kwargs)


# -- the order page's private link --------------------------------------------------------------


def test_the_order_pages_private_link_is_at_public_base_url_whatever_host_the_request_named(shop):
    browser = Shopper(shop, client=forged_client(shop))
    ref = browser.buy()
    token = db_token(shop, ref)
    page = browser.client.get(f"/orders/{ref}", headers=HTML)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f"{PUBLIC}/orders/{ref}?token={token}" in html
    assert FORGED_HOST not in html
    as_json = browser.client.get(f"/orders/{ref}", headers=JSON)
    assert as_json.status_code == 200 and FORGED_HOST not in as_json.get_data(as_text=True)
    assert FORGED_HOST not in (page.headers.get("Content-Location") or "")


def db_token(app, ref: str) -> str:
    with app.app_context():
        return db.session.get(Order, order_id(app, ref)).access_token


# -- routing redirects --------------------------------------------------------------------------


ROUTING_REDIRECTS = [
    # (method, raw path, query, where it must lead). A leading `//` alone is no redirect: werkzeug
    # matches `//orders` as `/orders`.
    ("GET", "/orders//BK-AAAAAAAA", "", "/orders/BK-AAAAAAAA"),
    ("GET", "/orders//BK-AAAAAAAA", "token=abc", "/orders/BK-AAAAAAAA?token=abc"),
    ("POST", "/cart//items", "", "/cart/items"),
    ("POST", "/orders/BK-AAAAAAAA//pay", "", "/orders/BK-AAAAAAAA/pay"),
    ("GET", "/console", "", "/console/"),
    ("GET", "//console", "", "/console/"),
    ("GET", "/console//", "", "/console/"),
    ("GET", "//console//orders", "stuck=1", "/console/orders?stuck=1"),
]


@pytest.mark.parametrize("accept", [HTML, JSON], ids=["html", "json"])
@pytest.mark.parametrize(
    "method,path,query,target", ROUTING_REDIRECTS, ids=[f"{m} {p}" for m, p, _, _ in ROUTING_REDIRECTS]
)
def test_a_routing_redirect_leads_to_a_relative_location_never_to_the_forged_host(
    shop, method, path, query, target, accept
):
    client = forged_client(shop)
    if path.lstrip("/").startswith("console"):
        log_in(shop, client)  # a visitor would be sent to the login first (a redirect of its own, below)
    r = path_request(client, method, path, query_string=query, headers=accept)
    assert r.status_code in (301, 308), (r.status_code, r.get_data(as_text=True)[:300])
    assert r.headers["Location"] == target
    assert FORGED_HOST not in r.get_data(as_text=True)


# -- every redirect the storefront and the console make ---------------------------------------


STOREFRONT = {
    "add to cart": lambda b, ref: b.add(),
    "change a cart line": lambda b, ref: b.post(f"/cart/items/{b.app.skus[DEFAULT_SKU]}/quantity", quantity=2),
    "remove a cart line": lambda b, ref: b.post(f"/cart/items/{b.app.skus[DEFAULT_SKU]}/delete"),
    "checkout, provider unreachable": lambda b, ref: b.checkout(quantity=1),
    "cancel": lambda b, ref: b.post(f"/orders/{ref}/cancel", version=1),
    "cancel page of a finished order": lambda b, ref: (
        b.post(f"/orders/{ref}/cancel", version=1),
        b.client.get(f"/orders/{ref}/cancel", headers=HTML),
    )[1],
}


@pytest.mark.parametrize("action", list(STOREFRONT))
def test_every_storefront_redirect_is_relative_whatever_host_the_request_named(shop, action):
    browser = Shopper(shop, client=forged_client(shop))
    ref = browser.buy()
    browser.add()  # a cart line for the cart's own forms
    r = STOREFRONT[action](browser, ref)
    assert r.status_code in (302, 303), (action, r.status_code, r.get_data(as_text=True)[:300])
    assert_not_forged(r.headers.get("Location"), action)


def test_checkout_and_return_with_the_provider_give_it_public_urls_and_lead_back_relative(make_shop, sandbox):
    app = make_shop(sandbox=True)
    browser = Shopper(app, client=forged_client(app))
    provider = sandbox.base_url
    r = browser.checkout()
    assert r.status_code == 303
    assert_not_forged(r.headers["Location"], "checkout", provider=provider)
    assert r.headers["Location"].startswith(provider)
    order = browser.latest()
    session = provider_session(sandbox, order["payment"]["session_id"])
    assert session["success_url"].startswith(f"{PUBLIC}/checkout/return?order={order['reference']}&")
    assert session["cancel_url"] == f"{PUBLIC}/orders/{order['reference']}?token={db_token(app, order['reference'])}"
    sandbox.set_outcome(order["payment"]["session_id"], "paid")
    back = browser.come_back(order["reference"], order["payment"]["session_id"])
    assert back.status_code == 303
    assert_not_forged(back.headers["Location"], "return page")
    again = browser.client.get(f"/orders/{order['reference']}", headers=HTML)
    assert FORGED_HOST not in again.get_data(as_text=True)


def test_pay_now_leads_to_the_provider_with_public_return_urls(make_shop, sandbox):
    app = make_shop(sandbox=True)
    browser = Shopper(app, client=forged_client(app))
    sandbox.faults(api_unavailable=True)
    ref = browser.buy()  # the order stands without a payment session; its page offers "Pay now"
    sandbox.faults(api_unavailable=False)
    r = browser.post(f"/orders/{ref}/pay")
    assert r.status_code == 303, r.get_data(as_text=True)[:300]
    assert_not_forged(r.headers["Location"], "pay now", provider=sandbox.base_url)
    session = provider_session(sandbox, browser.order(ref)["payment"]["session_id"])
    assert session["success_url"].startswith(f"{PUBLIC}/checkout/return?order={ref}&")
    assert session["cancel_url"].startswith(f"{PUBLIC}/orders/{ref}?token=")


def provider_session(sandbox, session_id: str) -> dict:
    """The Checkout Session as the provider keeps it (its success and cancel URLs)."""
    answer = requests.get(
        f"{sandbox.base_url}/v1/checkout/sessions/{session_id}",
        headers={"Authorization": "Bearer sk_test_backstop"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


CONSOLE = {
    "a visitor sent to the login": lambda c, token: c.get("/console/orders?stuck=1", headers=HTML),
    "the login page of a logged-in operator": lambda c, token: c.get("/console/login", headers=HTML),
    "an action done": lambda c, token: c.post(
        "/console/outbox/retry-dead", data={"csrf_token": token, "what": "delivery:send_email"}, headers=HTML
    ),
    "an action done, back to the page it was on": lambda c, token: c.post(
        "/console/outbox/retry-dead",
        data={"csrf_token": token, "what": "delivery:send_email", "next": "/console/outbox?status=dead"},
        headers=HTML,
    ),
    "logout": lambda c, token: c.post("/console/logout", data={"csrf_token": token}, headers=HTML),
    "logout everywhere": lambda c, token: c.post("/console/logout-everywhere", data={"csrf_token": token}),
}


@pytest.mark.parametrize("action", list(CONSOLE))
def test_every_console_redirect_is_relative_whatever_host_the_request_named(shop, action):
    client = forged_client(shop)
    token = None
    if action != "a visitor sent to the login":
        token = log_in(shop, client)
    r = CONSOLE[action](client, token)
    assert r.status_code in (302, 303), (action, r.status_code, r.get_data(as_text=True)[:300])
    assert_not_forged(r.headers.get("Location"), action)


def test_the_login_itself_leads_on_with_a_relative_location(shop):
    client = forged_client(shop)
    r = client.post("/console/login", data={})  # no token: refused in words, no redirect anywhere
    assert FORGED_HOST not in r.get_data(as_text=True)
    log_in(shop, client)  # log_in asserts the login's 303 ...
    r = client.get("/console/", headers=HTML)
    assert r.status_code == 200 and FORGED_HOST not in r.get_data(as_text=True)


# -- emails -------------------------------------------------------------------------------------


def test_an_email_rendered_during_a_forged_request_links_to_public_base_url(shop):
    browser = Shopper(shop, client=forged_client(shop))
    ref = browser.buy()
    browser.post(f"/orders/{ref}/cancel", version=1)
    with shop.test_request_context("/", base_url=f"http://{FORGED_HOST}", environ_base=FORGED):
        order = db.session.get(Order, order_id(shop, ref))
        email = render("order_cancelled", order)
    assert email is not None
    assert f"{PUBLIC}/orders/{ref}?token={order.access_token}" in email.body
    assert FORGED_HOST not in email.body
