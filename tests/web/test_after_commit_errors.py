"""A database connection killed under a request: a completed action is never turned into an error
page. The checkout whose order committed sends the customer to that order (its reference in the
answer); the cancel that committed says the order is cancelled; and a rollback that fails at the
request's teardown no longer escapes every error handler (the server's bare "Internal Server
Error" was what the customer saw)."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import create_engine, text

from factories import seed_catalog_rows
from payment_helpers import JSON, Shopper
from shop.extensions import db
from shop.models import Order
from shop.storefront import routes

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgresql")
pytestmark = pytest.mark.skipif(not ON_POSTGRES, reason="needs a database server whose backends can be killed")


def _kill(database_url: str, pid: int) -> None:
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
    admin.dispose()


def _pooled_backend() -> int:
    """The backend of the connection the request's next statement will use."""
    pid = db.session.execute(text("SELECT pg_backend_pid()")).scalar_one()
    db.session.commit()
    return pid


def _orders(app) -> list[tuple[str, str]]:
    with app.app_context():
        rows = [(o.reference, o.status) for o in db.session.query(Order).order_by(Order.id)]
        db.session.remove()
        return rows


def test_a_rollback_that_fails_at_teardown_leaves_the_answer_standing(fresh_app, database_url):
    @fresh_app.get("/_test/read-then-lose-the-connection")
    def read_then_lose_the_connection():
        pid = db.session.execute(text("SELECT pg_backend_pid()")).scalar_one()  # a transaction is open
        _kill(database_url, pid)
        return "read"

    r = fresh_app.test_client().get("/_test/read-then-lose-the-connection")

    assert (r.status_code, r.get_data(as_text=True)) == (200, "read")
    with fresh_app.app_context():  # the pool replaced the dead connection
        assert db.session.execute(text("SELECT 1")).scalar_one() == 1
        db.session.remove()


def test_a_checkout_that_committed_answers_with_its_order_when_the_database_goes_after(
    fresh_paying_app, sandbox, database_url, monkeypatch
):
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    real = routes.start_payment

    def lose_the_database_then_start(order_id, **kwargs):
        _kill(database_url, _pooled_backend())
        return real(order_id, **kwargs)

    monkeypatch.setattr(routes, "start_payment", lose_the_database_then_start)

    assert shopper.add("NB-A5-DOT").status_code == 303
    r = shopper.checkout_cart(headers=JSON)

    [(reference, status)] = _orders(fresh_paying_app)
    assert status == "PendingPayment"  # placed; its payment never started
    assert r.status_code == 303, r.get_data(as_text=True)
    assert r.headers["Location"].endswith(f"/orders/{reference}")
    body = r.get_json()
    assert body["reference"] == reference and body["payment_url"] is None and "Pay now" in body["message"]
    monkeypatch.undo()
    page = shopper.order(reference)  # the browser owns it and can pay from its page
    assert page["status"] == "PendingPayment"
    assert shopper.pay(reference).status_code == 200
    assert shopper.order(reference)["status"] == "PaymentInitiated"


def test_a_cancel_that_committed_says_so_when_the_database_goes_before_the_page(
    fresh_paying_app, sandbox, database_url, monkeypatch
):
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    order = shopper.place()
    real = routes.cancel_order

    def cancel_then_lose_the_database(order_id, version):
        pid = _pooled_backend()
        outcome = real(order_id, version)
        _kill(database_url, pid)
        return outcome

    monkeypatch.setattr(routes, "cancel_order", cancel_then_lose_the_database)

    r = shopper.cancel(order["reference"], order["version"])

    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json()["status"] == "Cancelled"
    assert _orders(fresh_paying_app) == [(order["reference"], "Cancelled")]
