"""`Idempotency-Key` on the storefront's POSTs (docs/REFERENCE.md, Storefront): a JSON client's
retry gets the first answer again and nothing is done twice; another body under the same key is
a 422, a key whose first request still runs a 409; without the header nothing changes; the
answers are pruned after a day. Real database and Redis, the sandbox as the provider."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select, update

from payment_helpers import JSON, Shopper
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import AnswerState, CartItem, IdempotentRequest, Order
from shop.scheduling import retention


def _count(app, model) -> int:
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(model)).scalar_one()
        db.session.remove()
        return n


def _keyed(key: str) -> dict:
    return {**JSON, "Idempotency-Key": key}


def test_a_retried_checkout_gets_the_first_answer_and_places_one_order(shopper, fresh_paying_app):
    assert shopper.add("MUG-350-SND", 1).status_code == 303

    first = shopper.checkout_cart(headers=_keyed("checkout-1"))
    again = shopper.checkout_cart(headers=_keyed("checkout-1"))

    assert first.status_code == 303 and "Idempotent-Replayed" not in first.headers
    assert again.status_code == 303 and again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert again.get_json() == first.get_json() and first.get_json()["reference"]
    assert _count(fresh_paying_app, Order) == 1


def test_the_same_key_with_another_body_is_refused_in_words(shopper):
    assert shopper.add("MUG-350-SND", 1, headers=_keyed("add-1")).status_code == 201

    other = shopper.add("MUG-350-SND", 2, headers=_keyed("add-1"))

    assert other.status_code == 422
    assert "used for another request" in other.get_json()["error"]


def test_a_key_whose_first_request_still_runs_is_a_409_and_one_abandoned_is_taken_over(shopper, fresh_paying_app):
    assert shopper.add("MUG-350-SND", 1, headers=_keyed("add-2")).status_code == 201
    with fresh_paying_app.app_context():
        # As if the first were still running: its claim is there, its answer not yet.
        db.session.execute(update(IdempotentRequest).values(state=AnswerState.RUNNING, created_at=utcnow()))
        db.session.commit()

    running = shopper.add("MUG-350-SND", 1, headers=_keyed("add-2"))
    assert running.status_code == 409 and running.headers["Retry-After"] == "1"

    with fresh_paying_app.app_context():
        # Its process died long ago: the key is taken over and the request runs.
        db.session.execute(update(IdempotentRequest).values(created_at=utcnow() - timedelta(minutes=5)))
        db.session.commit()
    taken_over = shopper.add("MUG-350-SND", 1, headers=_keyed("add-2"))
    assert taken_over.status_code == 201 and "Idempotent-Replayed" not in taken_over.headers


def test_adding_to_the_cart_twice_adds_twice_without_a_key_and_once_with_one(shopper, fresh_paying_app):
    for _ in range(2):
        assert shopper.add("MUG-350-SND", 1).status_code == 303
    for _ in range(2):
        assert shopper.add("SOCK-M", 1, headers=_keyed("socks")).status_code == 201

    with fresh_paying_app.app_context():
        quantities = sorted(q for (q,) in db.session.execute(select(CartItem.quantity)))
        db.session.remove()
    assert quantities == [1, 2]  # the socks once, the mugs twice


def test_a_malformed_key_is_refused_and_runs_nothing(shopper, fresh_paying_app):
    bad = shopper.add("MUG-350-SND", 1, headers=_keyed("has spaces"))

    assert bad.status_code == 400 and "printable ASCII" in bad.get_json()["error"]
    assert _count(fresh_paying_app, CartItem) == 0


def test_a_key_and_its_answer_are_pruned_after_a_day(shopper, fresh_paying_app):
    assert shopper.add("MUG-350-SND", 1, headers=_keyed("add-3")).status_code == 201

    with fresh_paying_app.app_context():
        assert retention.prune(utcnow() + timedelta(hours=23)).counts["idempotent_requests"] == 0
        assert retention.prune(utcnow() + timedelta(hours=25)).counts["idempotent_requests"] == 1
        db.session.remove()
    assert _count(fresh_paying_app, IdempotentRequest) == 0


def test_a_pay_and_a_cancel_retried_with_their_keys_act_once(make_shop):
    app = make_shop(sandbox=True)
    shopper = Shopper(app)
    order = shopper.place("MUG-350-SND", 1)
    ref, version = order["reference"], order["version"]

    first = shopper.cancel(ref, version, headers=_keyed("cancel-1"))
    again = shopper.cancel(ref, version, headers=_keyed("cancel-1"))

    assert first.status_code == 200 and again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true" and again.get_json() == first.get_json()
    paid_after = shopper.post(f"/orders/{ref}/pay", headers=_keyed("pay-1"))
    paid_again = shopper.post(f"/orders/{ref}/pay", headers=_keyed("pay-1"))
    assert paid_again.status_code == paid_after.status_code
    assert paid_again.headers["Idempotent-Replayed"] == "true"
