"""The checkout's "did you mean" (docs/REFERENCE.md, Storefront: POST /checkout): an address whose
domain is a known misspelling comes back once, nothing placed, with the address probably meant
and both choices; submitting either places the order, to the address chosen."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from payment_helpers import JSON
from shop.extensions import db
from shop.models import Order
from shop.storefront.email_typos import suggested_email


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("ann@example.con", "ann@example.com"),
        ("ann@gmial.com", "ann@gmail.com"),
        ("Ann.Lee@GMAIL.CO", "Ann.Lee@gmail.com"),
        ("ann@hotmial.com", "ann@hotmail.com"),
        ("ann@yaho.com", "ann@yahoo.com"),
        ("ann@outlok.com", "ann@outlook.com"),
        ("ann@shop.example.con", "ann@shop.example.com"),
        ("ann@charity.ogr", "ann@charity.org"),
    ],
)
def test_a_known_misspelled_domain_suggests_the_one_meant_keeping_the_name(typed, meant):
    assert suggested_email(typed) == meant


@pytest.mark.parametrize("typed", ["ann@gmail.com", "ann@example.co", "ann@example.com", "ann@comcast.net", "ann"])
def test_a_domain_not_in_the_table_suggests_nothing(typed):
    assert suggested_email(typed) is None


def _emails(app) -> list[str]:
    with app.app_context():
        try:
            return list(db.session.execute(select(Order.email).order_by(Order.id)).scalars())
        finally:
            db.session.remove()


def test_a_misspelled_domain_comes_back_once_with_both_choices_and_nothing_placed(shop, browser):
    assert browser.add("NB-A5-DOT", 1).status_code == 303

    page = browser.checkout_cart("ann@gmial.com")
    html = page.get_data(as_text=True)
    assert page.status_code == 400 and 'id="email-suggestion"' in html
    assert "Did you mean <strong>ann@gmail.com</strong>? Choose the address your receipt should go to." in html
    assert "Use ann@gmail.com" in html and "Keep ann@gmial.com" in html
    assert 'name="kept_email" value="ann@gmial.com"' in html
    assert _emails(shop) == []


def test_choosing_the_suggested_address_places_the_order_to_it(shop, browser):
    assert browser.add("NB-A5-DOT", 1).status_code == 303
    assert browser.checkout_cart("ann@gmial.com").status_code == 400

    assert browser.post("/checkout", email="ann@gmail.com").status_code == 303
    assert _emails(shop) == ["ann@gmail.com"]


def test_keeping_the_address_as_typed_places_the_order_to_it_without_asking_again(shop, browser):
    assert browser.add("NB-A5-DOT", 1).status_code == 303
    assert browser.checkout_cart("ann@gmial.com").status_code == 400

    assert browser.post("/checkout", email="ann@gmial.com", kept_email="ann@gmial.com").status_code == 303
    assert _emails(shop) == ["ann@gmial.com"]


def test_a_kept_address_does_not_keep_another_misspelling(shop, browser):
    assert browser.add("NB-A5-DOT", 1).status_code == 303

    r = browser.post("/checkout", email="ann@yaho.com", kept_email="ann@gmial.com")

    assert r.status_code == 400 and "Use ann@yahoo.com" in r.get_data(as_text=True)
    assert _emails(shop) == []


def test_a_json_client_is_never_held_up_by_a_guess_and_places_the_order_as_typed(shop, browser):
    """The JSON checkout is an API (docs/REFERENCE.md, Storefront): a script's address is taken as sent."""
    assert browser.add("NB-A5-DOT", 1).status_code == 303

    r = browser.checkout_cart("ann@gmial.com", headers=JSON)

    assert r.status_code in (201, 303), r.get_data(as_text=True)
    assert _emails(shop) == ["ann@gmial.com"]
