"""The stock page's shelf count over HTTP: the page shows what the shelf should hold (on hand plus
what orders hold), a count becomes on hand less what orders hold, a count below that is refused in
words, a conflict brings the form back with the new figures, the operator's count and reason kept
and a "Set it anyway" button, and the audit trail records the count, what was held and on hand."""

from __future__ import annotations

import html
import re

from factories import catalog_rows, on_hand, place_order_for
from shop.extensions import db
from shop.models import OperatorAction, StockCorrection
from support import log_in

HTML, JSON = {"Accept": "text/html"}, {"Accept": "application/json"}


def _checkout(app, variant, quantity):
    with app.app_context():
        place_order_for({variant: quantity})
        db.session.remove()


def _count_form(page: str) -> dict[str, str]:
    """The hidden and typed values of the page's shelf count form."""
    form = re.search(r"<form[^>]*>(?:(?!</form>).)*name=\"count\"(?:(?!</form>).)*</form>", page, re.S)
    assert form, "no shelf count form on the page"
    text = form.group(0)
    values = dict(re.findall(r'name="(\w+)"[^>]*?value="([^"]*)"', text))
    reason = re.search(r'<textarea[^>]*name="reason"[^>]*>([^<]*)</textarea>', text)
    values["reason"] = html.unescape(reason.group(1)) if reason else ""
    values["button"] = re.search(r"<button[^>]*>([^<]*)</button>", text).group(1)
    return values


def test_the_page_shows_what_the_shelf_should_hold_and_a_count_becomes_on_hand_less_what_orders_hold(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(10)
    _checkout(fresh_app, variant, 3)
    client = fresh_app.test_client()
    token = log_in(fresh_app, client)
    page = client.get(f"/console/inventory/{variant}", headers=JSON).get_json()
    assert (page["on_hand"], page["held"], page["shelf"]) == (
        7,
        {"unpaid": 3, "paid": 0, "returning": 0, "total": 3},
        10,
    )
    listed = client.get("/console/inventory", headers=JSON).get_json()["variants"]
    assert [(v["id"], v["on_hand"], v["held"], v["shelf"]) for v in listed] == [(variant, 7, 3, 10)]
    form = _count_form(client.get(f"/console/inventory/{variant}").get_data(as_text=True))
    assert (form["seen"], form["held"], form["count"], form["button"]) == ("7", "3", "", "Set from the count")
    data = {**form, "csrf_token": token, "count": "8", "reason": "shelf count: two missing"}
    answer = client.post(f"/console/inventory/{variant}/adjust", data=data, headers=JSON)
    assert answer.status_code == 200, answer.get_json()
    body = answer.get_json()
    assert (body["old"], body["new"], body["count"], body["held"]["total"]) == (7, 5, 8, 3)
    assert on_hand(variant, fresh_app) == 5
    with fresh_app.app_context():
        (row,) = db.session.query(OperatorAction).all()
        (correction,) = db.session.query(StockCorrection).all()
        assert (row.action, row.status, row.reason) == ("adjust_inventory", 200, "shelf count: two missing")
        assert "shelf count of 8: orders hold 3 (3 unpaid, 0 paid and not yet shipped" in row.outcome
        assert "on hand went from 7 to 5" in row.outcome
        assert (correction.mode, correction.old_on_hand, correction.new_on_hand) == ("count", 7, 5)


def test_a_count_below_what_orders_hold_is_refused_in_words_with_the_count_kept(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(10)
    _checkout(fresh_app, variant, 4)
    client = fresh_app.test_client()
    token = log_in(fresh_app, client)
    form = _count_form(client.get(f"/console/inventory/{variant}").get_data(as_text=True))
    data = {**form, "csrf_token": token, "count": "3", "reason": "recount"}
    answer = client.post(f"/console/inventory/{variant}/adjust", data=data, headers=HTML)
    assert answer.status_code == 400
    page = html.unescape(answer.get_data(as_text=True))
    assert "The shelf count 3 is below the 4 units orders hold of this variant" in page
    assert (_count_form(answer.get_data(as_text=True))["count"], on_hand(variant, fresh_app)) == ("3", 6)
    r = client.post(f"/console/inventory/{variant}/adjust", data=data, headers=JSON)
    assert (r.status_code, r.get_json()["why"], r.get_json()["held"]["total"]) == (400, "below_held", 4)


def test_a_checkout_after_the_page_brings_the_form_back_with_new_figures_and_set_it_anyway_saves(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(10)
    client = fresh_app.test_client()
    token = log_in(fresh_app, client)
    form = _count_form(client.get(f"/console/inventory/{variant}").get_data(as_text=True))
    assert (form["seen"], form["held"]) == ("10", "0")
    _checkout(fresh_app, variant, 2)  # between the page and the save
    data = {**form, "csrf_token": token, "count": "9", "reason": "one fell behind the shelf"}
    conflict = client.post(f"/console/inventory/{variant}/adjust", data=data, headers=HTML)
    assert conflict.status_code == 409
    text = conflict.get_data(as_text=True)
    assert "on hand is 8 now and orders hold 2, so the shelf should hold 10" in html.unescape(text)
    again = _count_form(text)
    assert (again["seen"], again["held"], again["count"], again["reason"]) == ("8", "2", "9", data["reason"])
    assert (again["button"], again["request_key"]) == ("Set it anyway", form["request_key"])
    assert on_hand(variant, fresh_app) == 8  # the checkout's decrement stands
    script = client.post(f"/console/inventory/{variant}/adjust", data={**data, "request_key": "j" * 32}, headers=JSON)
    assert (script.status_code, script.get_json()["why"], script.get_json()["on_hand"]) == (409, "changed", 8)
    assert script.get_json()["held"] == {"unpaid": 2, "paid": 0, "returning": 0, "total": 2}
    done = client.post(f"/console/inventory/{variant}/adjust", data={**again, "csrf_token": token})
    assert done.status_code == 303
    assert on_hand(variant, fresh_app) == 7
    with fresh_app.app_context():
        audit = [(a.status, a.reason) for a in db.session.query(OperatorAction).order_by(OperatorAction.id)]
        assert audit == [(409, data["reason"]), (409, data["reason"]), (303, data["reason"])]


def test_setting_on_hand_directly_stays_and_says_it_leaves_what_orders_hold_aside(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(10)
    _checkout(fresh_app, variant, 3)
    client = fresh_app.test_client()
    token = log_in(fresh_app, client)
    page = html.unescape(client.get(f"/console/inventory/{variant}").get_data(as_text=True))
    assert "On hand is what is free to sell now, not counting the 3 held by orders" in page
    data = {"csrf_token": token, "on_hand": "4", "seen": "7", "reason": "direct", "request_key": "d" * 32}
    assert client.post(f"/console/inventory/{variant}/adjust", data=data).status_code == 303
    assert on_hand(variant, fresh_app) == 4
    both = {"csrf_token": token, "count": "4", "on_hand": "4", "reason": "both"}
    r = client.post(f"/console/inventory/{variant}/adjust", data=both, headers=JSON)
    assert r.status_code == 400 and "not both" in r.get_json()["error"]
