"""The session cookie (shop/web/cookies.py): sent when it changes, and again once it is a day old,
so a browser that keeps coming back keeps its orders; not re-signed on every answer."""

from __future__ import annotations

from itsdangerous import URLSafeTimedSerializer

from payment_helpers import Shopper

DAY = 24 * 3600


def _placed(shopper: Shopper) -> str:
    """A checkout (the provider unreachable: the order waits with "Pay now"); its reference."""
    assert shopper.checkout().status_code == 303
    return shopper.latest()["reference"]


def _mine(shopper: Shopper) -> str:
    page = shopper.client.get("/orders", headers={"Accept": "application/json"})
    assert page.status_code == 200
    return page.get_data(as_text=True)


def _session_cookie(response) -> str | None:
    for header in response.headers.getlist("Set-Cookie"):
        if header.startswith("session="):
            return header
    return None


def test_an_unchanged_session_cookie_is_sent_again_only_once_it_is_a_day_old(make_shop, fake_clock):
    app = make_shop(CLOCK=fake_clock)
    shopper = Shopper(app)
    added = shopper.add()
    assert added.status_code == 303 and _session_cookie(added), "the new browser's id is sent at once"
    ref = _placed(shopper)
    shopper.client.get("/cart")  # shows, and so takes from the session, what the checkout flashed

    for _ in range(3):  # nothing in the session changes: nothing to send
        page = shopper.client.get("/cart")
        assert page.status_code == 200 and _session_cookie(page) is None

    fake_clock.advance(DAY - 60)
    assert _session_cookie(shopper.client.get("/cart")) is None, "23 h 59 min old: not yet"
    fake_clock.advance(60)
    renewed = _session_cookie(shopper.client.get("/cart"))
    assert renewed and "Expires=" in renewed, "a day old: signed anew, its expiry moved on"
    assert _session_cookie(shopper.client.get("/cart")) is None, "the renewed cookie counts from now"
    assert ref in _mine(shopper), "the browser's order is still its own"


def test_a_cookie_past_its_lifetime_on_the_shops_clock_is_a_new_browser(make_shop, fake_clock):
    app = make_shop(CLOCK=fake_clock)
    shopper = Shopper(app)
    ref = _placed(shopper)
    assert ref in _mine(shopper)
    fake_clock.advance(app.permanent_session_lifetime.total_seconds() + 1)
    assert ref not in _mine(shopper)


def test_a_session_cookie_signed_with_another_key_is_a_new_browser(make_shop):
    app = make_shop()
    shopper = Shopper(app)
    ref = _placed(shopper)
    interface = app.session_interface
    signer = interface.get_signing_serializer(app)
    cookie = shopper.client.get_cookie("session")
    assert signer is not None and cookie is not None
    data = signer.loads(cookie.value)
    assert data.get("bid"), data
    forged = URLSafeTimedSerializer(
        "another-secret",
        salt=interface.salt,
        serializer=interface.serializer,
        signer_kwargs={"key_derivation": interface.key_derivation, "digest_method": interface.digest_method},
    ).dumps(data)
    shopper.client.set_cookie("session", forged)
    assert ref not in _mine(shopper)
