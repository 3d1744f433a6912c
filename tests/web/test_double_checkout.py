"""A double checkout (two submits of the same cart, a second tab, a retried POST): one order is
placed, and the other answer points at it ("This cart was just ordered: see order BK-…") with a
link that this browser, and only this browser, can open. Real database and the sandbox over HTTP."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import requests

from factories import force_order, seed_catalog_rows
from payment_helpers import HTML, JSON, HttpClient, Shopper, served
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.orders.lookup import JUST_ORDERED_SECONDS

LINK = re.compile(r'This cart was just ordered: see order <a href="(/orders/(BK-[A-Z0-9]+))">\2</a>\.')


def test_the_second_submit_of_a_cart_points_at_the_order_the_first_placed(shopper, sandbox):
    shopper.add("MUG-350-SND", 2)
    first = shopper.checkout_cart()
    assert first.status_code == 303
    placed = shopper.latest()

    second = shopper.checkout_cart()
    assert second.status_code == 409
    page = second.get_data(as_text=True)
    [(url, reference)] = LINK.findall(page)
    assert reference == placed["reference"] and url == f"/orders/{reference}"
    assert "Your cart is empty." not in page  # not only that
    # The link works for this browser (it owns the order), and for nobody else.
    assert shopper.client.get(url, headers=HTML).status_code == 200
    assert shopper.client.get(url, headers=JSON).get_json()["reference"] == reference
    stranger = Shopper(shopper.app, shopper.skus)
    assert stranger.client.get(url, headers=HTML).status_code == 404

    answer = shopper.checkout_cart(headers=JSON)
    assert answer.status_code == 409
    data = answer.get_json()
    assert data["error"] == f"This cart was just ordered: see order {reference}."
    assert (data["reference"], data["order_url"]) == (reference, url)
    assert len(shopper.client.get("/orders", headers=JSON).get_json()["orders"]) == 1


def test_an_empty_cart_long_after_the_last_order_is_only_empty(fresh_paying_app, shopper, sandbox):
    shopper.buy()
    reference = shopper.latest()["reference"]
    with fresh_paying_app.app_context():
        force_order(reference, created_at=utcnow() - timedelta(seconds=JUST_ORDERED_SECONDS + 60))
        db.session.remove()

    again = shopper.checkout_cart()
    assert again.status_code == 400, again.get_data(as_text=True)[-3000:]
    page = again.get_data(as_text=True)
    assert "Your cart is empty." in page and "just ordered" not in page


def test_another_browsers_empty_checkout_learns_nothing_of_this_order(shopper, sandbox):
    shopper.buy()
    stranger = Shopper(shopper.app, shopper.skus)
    answer = stranger.checkout_cart()
    page = answer.get_data(as_text=True)
    assert answer.status_code == 400 and "Your cart is empty." in page and "just ordered" not in page


def test_two_concurrent_submits_of_one_cart_place_one_order_and_the_loser_links_to_it(make_fresh_app, sandbox):
    def build(base_url):
        return make_fresh_app(
            STRIPE_API_BASE=sandbox.base_url,
            STRIPE_SESSION_MIN_SECONDS=60,
            STRIPE_WEBHOOK_SECRET="whsec_test_secret",
            PUBLIC_BASE_URL=base_url,
        )

    with served(build) as (app, base_url):
        skus = seed_catalog_rows(app)
        browser = requests.Session()
        shopper = Shopper.over_http(base_url, skus, session=browser)
        assert shopper.add("NB-A5-DOT", 2).status_code == 303

        # Two tabs of one browser: the same cookies, submitting at the same moment.
        tabs = [HttpClient(base_url, session=_same_cookies(browser)) for _ in range(2)]
        start, answers = threading.Barrier(2), [None, None]

        def submit(i):
            start.wait()
            answers[i] = tabs[i].post(
                "/checkout", headers=HTML, data={"csrf_token": shopper.token, "email": shopper.email}
            )

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

        statuses = sorted(a.status_code for a in answers)
        assert statuses == [303, 409], statuses
        [orders] = [shopper.client.get("/orders", headers=JSON).get_json()["orders"]]
        assert len(orders) == 1
        loser = next(a for a in answers if a.status_code == 409).get_data(as_text=True)
        [(url, reference)] = LINK.findall(loser)
        assert reference == orders[0]["reference"]
        assert shopper.client.get(url, headers=HTML).status_code == 200


def _same_cookies(browser: requests.Session) -> requests.Session:
    tab = requests.Session()
    tab.cookies.update(browser.cookies)
    return tab


def test_a_new_cart_emptied_after_an_order_is_only_empty(shopper, sandbox):
    shopper.buy()
    shopper.add("SOCK-M")
    assert shopper.post(f"/cart/items/{shopper.skus['SOCK-M']}/delete").status_code == 303
    answer = shopper.checkout_cart()
    page = answer.get_data(as_text=True)
    assert answer.status_code == 400 and "Your cart is empty." in page and "just ordered" not in page
