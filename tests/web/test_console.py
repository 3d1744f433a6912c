"""The operator console over HTTP: the login gate, CSRF on every action, the JSON shapes of
docs/REFERENCE.md, Console, and that each button runs the same use case as the rest of the shop
(asserted on rows and stock, not on messages)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from compensation_support import cancel_in, dead_letter
from factories import force_order, on_hand, placed_order_in, variant_id
from payment_helpers import ProviderTransportLog
from shop.domain.deadlines import utcnow
from shop.domain.restoration import MAX_ON_HAND
from shop.extensions import db
from shop.models import (
    InventoryItem,
    Order,
    OutboxDelivery,
    OutboxEvent,
    ReconciliationCycle,
    RestoreWarning,
    ScheduledCommand,
    WebhookReceipt,
)
from shop.outbox import dispatch
from shop.provider import guard
from shop.seed import upsert_operator
from support import OPERATOR_EMAIL as EMAIL
from support import OPERATOR_PASSWORD as PASSWORD
from support import add_operator, csrf_token, log_in, log_in_again

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}

GET_ROUTES = [
    "/console/",
    "/console/orders",
    "/console/orders?stuck=1&status=PendingPayment",
    "/console/orders/BK-NOSUCH",
    "/console/outbox?status=dead",
    "/console/restore-warnings?state=open",
    "/console/webhooks",
    "/console/sweeps",
    "/console/audit",
    "/console/orders?q=ann@example.com",
    "/console/no-such-page",
    "/console/mail",
    "/console/mail/BK-NOSUCH-order_paid-event.eml",
]
POST_ROUTES = [
    "/console/logout",
    "/console/outbox/retry-dead",
    "/console/orders/BK-NOSUCH/reconcile",
    "/console/outbox/1/retry",
    "/console/outbox/1/discard",
    "/console/outbox/cmd-1/retry",
    "/console/outbox/cmd-1/discard",
    "/console/restore-warnings/1/resolve",
]
# The contract's outbox item, plus whether the row is waiting for an unavailable provider.
DELIVERY_KEYS = {
    "id",
    "event",
    "handler",
    "status",
    "attempts",
    "last_error",
    "order_reference",
    "waiting_for_provider",
}
WARNING_KEYS = {"id", "order_reference", "variant_id", "quantity", "reason", "state"}


# -- helpers ---------------------------------------------------------------------------------


def run_delivery(app, delivery_id, now=None) -> str:
    with app.app_context():
        return dispatch.run_delivery(delivery_id, now=now)


def make_overflow_warning(app, sku="MUG-350-SND"):
    """A cancelled order whose restore was refused by the stock-overflow invariant (so nothing,
    not even the marker, was saved). Returns (order_id, warning_id, variant_id)."""
    order_id, _ = placed_order_in(app, sku, 2)
    with app.app_context():
        vid = variant_id(sku)
        db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == vid).values(on_hand=MAX_ON_HAND))
        db.session.commit()
    assert run_delivery(app, cancel_in(app, order_id)) == "done"
    with app.app_context():
        warning = db.session.execute(select(RestoreWarning).where(RestoreWarning.order_id == order_id)).scalar_one()
        assert warning.state == "open" and "stock_would_overflow" in warning.reason
        assert db.session.get(Order, order_id).inventory_restored is False
        return order_id, warning.id, vid


# -- the login gate --------------------------------------------------------------------------


def test_every_console_route_sends_a_browser_to_login_and_answers_401_to_json(fresh_app, fresh_client):
    anonymous_token = csrf_token(fresh_client, "/console/login")
    for url in GET_ROUTES:
        r = fresh_client.get(url, headers=HTML)
        assert r.status_code == 302, url
        assert r.headers["Location"].startswith("/console/login"), url
        r = fresh_client.get(url, headers=JSON)
        assert r.status_code == 401, url
        assert "log in" in r.get_json()["error"].lower()
    for url in POST_ROUTES:
        for data in ({"csrf_token": anonymous_token}, {}):  # the gate comes before the CSRF check
            r = fresh_client.post(url, data=data, headers=HTML)
            assert r.status_code == 302 and r.headers["Location"].startswith("/console/login"), url
            assert fresh_client.post(url, data=data, headers=JSON).status_code == 401, url
    assert fresh_client.get("/console/login").status_code == 200


def test_login_sends_the_operator_back_to_the_page_they_asked_for(fresh_app, fresh_client):
    add_operator(fresh_app)
    r = fresh_client.get("/console/sweeps", headers=HTML)
    login_url = r.headers["Location"]
    page = fresh_client.get(login_url).get_data(as_text=True)
    next_value = re.search(r'name="next"[^>]*value="([^"]*)"', page).group(1)
    assert next_value == "/console/sweeps"
    r = fresh_client.post(
        "/console/login",
        data={
            "csrf_token": csrf_token(fresh_client, login_url),
            "email": EMAIL,
            "password": PASSWORD,
            "next": next_value,
        },
    )
    assert r.status_code == 303 and r.headers["Location"] == "/console/sweeps"
    assert fresh_client.get("/console/sweeps").status_code == 200


def test_a_login_never_redirects_off_the_console(fresh_app, fresh_client):
    add_operator(fresh_app)
    r = fresh_client.post(
        "/console/login",
        data={
            "csrf_token": csrf_token(fresh_client, "/console/login"),
            "email": EMAIL,
            "password": PASSWORD,
            "next": "//evil.example/steal",
        },
    )
    assert r.status_code == 303 and r.headers["Location"] == "/console/"


def test_a_wrong_password_and_an_unknown_email_get_the_same_401(fresh_app, fresh_client):
    with fresh_app.app_context():
        upsert_operator(EMAIL, PASSWORD)
    token = csrf_token(fresh_client, "/console/login")
    wrong_password = fresh_client.post(
        "/console/login", data={"csrf_token": token, "email": EMAIL, "password": "nope"}, headers=JSON
    )
    unknown_email = fresh_client.post(
        "/console/login", data={"csrf_token": token, "email": "who@example.com", "password": PASSWORD}, headers=JSON
    )
    assert wrong_password.status_code == unknown_email.status_code == 401
    assert wrong_password.get_json()["error"] == unknown_email.get_json()["error"]
    assert "match" in wrong_password.get_json()["error"]
    html = fresh_client.post("/console/login", data={"csrf_token": token, "email": EMAIL, "password": "nope"})
    assert html.status_code == 401 and "do not match" in html.get_data(as_text=True)
    assert fresh_client.get("/console/", headers=JSON).status_code == 401  # still not logged in


def test_a_malformed_login_is_a_400_in_words_not_a_500(fresh_app, fresh_client):
    token = csrf_token(fresh_client, "/console/login")
    r = fresh_client.post("/console/login", data={"csrf_token": token, "email": "", "password": ""}, headers=JSON)
    assert r.status_code == 400 and r.get_json()["error"]
    r = fresh_client.post(
        "/console/login", data={"csrf_token": token, "email": "a@b.c" * 100, "password": "x" * 5000}, headers=JSON
    )
    assert r.status_code == 400


def test_logging_out_closes_the_console_again(fresh_app, fresh_client, token):
    assert fresh_client.get("/console/", headers=JSON).status_code == 200
    r = fresh_client.post("/console/logout", data={"csrf_token": token})
    assert r.status_code == 303
    assert fresh_client.get("/console/", headers=JSON).status_code == 401


def test_every_console_post_refuses_a_missing_or_wrong_csrf_token(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    with fresh_app.app_context():
        warning = RestoreWarning(order_id=order_id, variant_id=None, quantity=1, reason="test", state="open")
        db.session.add(warning)
        db.session.commit()
        command = db.session.execute(select(ScheduledCommand.id).where(ScheduledCommand.order_id == order_id)).scalar()
        db.session.execute(update(ScheduledCommand).where(ScheduledCommand.id == command).values(status="dead"))
        db.session.commit()
        warning_id = warning.id
    posts = [
        (f"/console/orders/{ref}/reconcile", {}),
        (f"/console/outbox/{delivery}/retry", {}),
        (f"/console/outbox/{delivery}/discard", {"reason": "duplicate"}),
        (f"/console/outbox/cmd-{command}/retry", {}),
        (f"/console/outbox/cmd-{command}/discard", {"reason": "duplicate"}),
        (f"/console/restore-warnings/{warning_id}/resolve", {"action": "fixed"}),
        ("/console/outbox/retry-dead", {"what": "command:expire_unpaid_order"}),
        ("/console/logout", {}),
    ]
    for url, data in posts:
        for bad in ({}, {"csrf_token": "forged"}):
            r = fresh_client.post(url, data={**data, **bad}, headers=JSON)
            assert r.status_code == 400, url
            assert "form" in r.get_json()["error"].lower()
    with fresh_app.app_context():
        assert db.session.get(OutboxDelivery, delivery).status == "dead"
        assert db.session.get(ScheduledCommand, command).status == "dead"
        assert db.session.get(RestoreWarning, warning_id).state == "open"
    assert fresh_client.get("/console/", headers=JSON).status_code == 200  # the logout did not happen
    fresh = fresh_app.test_client()
    r = fresh.post("/console/login", data={"email": EMAIL, "password": PASSWORD}, headers=JSON)
    assert r.status_code == 400  # the login form itself is CSRF-protected


# -- dashboard and lists ---------------------------------------------------------------------


def test_dashboard_counts_a_stuck_order_a_dead_letter_and_an_open_warning(fresh_app, fresh_client, token):
    empty = fresh_client.get("/console/", headers=JSON).get_json()
    assert empty["stuck_orders"]["count"] == 0 and empty["dead_letters"]["count"] == 0
    assert empty["restore_warnings"]["count"] == 0 and empty["last_sweep"] is None

    two_hours_ago = utcnow() - timedelta(hours=2)
    stuck_id, _ = placed_order_in(fresh_app, now=two_hours_ago)
    placed_order_in(fresh_app)  # fresh: not stuck
    _, cancelled_ref = placed_order_in(fresh_app, "NB-A5-DOT")
    with fresh_app.app_context():
        cancelled_id = db.session.execute(select(Order.id).where(Order.reference == cancelled_ref)).scalar_one()
    delivery = cancel_in(fresh_app, cancelled_id)
    dead_letter(fresh_app, delivery)
    with fresh_app.app_context():
        db.session.add(
            RestoreWarning(
                order_id=cancelled_id,
                variant_id=None,
                quantity=1,
                reason="r",
                state="open",
                created_at=(warned_at := utcnow() - timedelta(minutes=12)),
            )
        )
        db.session.add(RestoreWarning(order_id=cancelled_id, variant_id=None, quantity=1, reason="r", state="resolved"))
        db.session.add(
            ReconciliationCycle(
                started_at=utcnow() - timedelta(minutes=3),
                finished_at=utcnow(),
                cutoff=utcnow(),
                status="ok",
                expiry_counts={"cancelled": 1},
                provider_counts={"paid": 2},
            )
        )
        db.session.commit()

    data = fresh_client.get("/console/", headers=JSON).get_json()
    asked_at = utcnow()  # the ages are at most how long ago each was backdated to, by now
    stuck = data["stuck_orders"]
    assert stuck["count"] == 1 and stuck["by_status"]["PendingPayment"]["count"] == 1
    assert 2 * 3600 - 60 <= stuck["oldest_age_seconds"] <= (asked_at - two_hours_ago).total_seconds() + 1
    assert data["dead_letters"]["count"] == 1 and data["dead_letters"]["deliveries"]["count"] == 1
    assert data["restore_warnings"]["count"] == 1
    assert 11 * 60 <= data["restore_warnings"]["oldest_age_seconds"] <= (asked_at - warned_at).total_seconds() + 1
    assert data["last_sweep"]["status"] == "ok" and data["last_sweep"]["provider_counts"] == {"paid": 2}

    html = fresh_client.get("/console/").get_data(as_text=True)
    assert "2 h" in html and "12 min" in html
    with fresh_app.app_context():
        assert db.session.get(Order, stuck_id).status == "PendingPayment"  # looking changes nothing


def test_stuck_orders_list_longest_waiting_first_all_orders_newest_first(fresh_app, fresh_client, token):
    now = utcnow()
    _, older = placed_order_in(fresh_app, now=now - timedelta(hours=5))
    _, old = placed_order_in(fresh_app, now=now - timedelta(hours=1))
    _, fresh = placed_order_in(fresh_app, now=now)
    data = fresh_client.get("/console/orders?stuck=1", headers=JSON).get_json()
    assert [o["reference"] for o in data["orders"]] == [older, old]
    assert all(o["stuck"] for o in data["orders"])
    everything = fresh_client.get("/console/orders", headers=JSON).get_json()
    assert [o["reference"] for o in everything["orders"]] == [fresh, old, older]
    assert fresh_client.get("/console/orders?stuck=1&status=Paid", headers=JSON).get_json()["orders"] == []
    r = fresh_client.get("/console/orders?status=Shipped", headers=JSON)
    assert r.status_code == 400 and "Shipped" in r.get_json()["error"]
    html = fresh_client.get("/console/orders?stuck=1").get_data(as_text=True)
    assert older in html and "5 h" in html and "$18.00" in html


def test_order_timeline_shows_transitions_deliveries_deadlines_and_warnings(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    with fresh_app.app_context():
        db.session.add(RestoreWarning(order_id=order_id, variant_id=99, quantity=1, reason="no inventory row"))
        db.session.add(
            WebhookReceipt(
                event_id="evt_1",
                event_type="checkout.session.expired",
                outcome="accepted",
                reason="",
                order_id=order_id,
                http_status=200,
            )
        )
        db.session.commit()
    data = fresh_client.get(f"/console/orders/{ref}", headers=JSON).get_json()
    assert data["order"]["reference"] == ref and data["order"]["status"] == "Cancelled"
    assert [t["event"] for t in data["transitions"]] == ["OrderPlaced", "OrderCancelled"]
    assert [d["id"] for d in data["deliveries"] if d["handler"] == "restore_inventory"] == [delivery]
    assert DELIVERY_KEYS <= set(data["deliveries"][0])
    assert [c["kind"] for c in data["commands"]] == ["expire_unpaid_order"]
    assert [w["variant_id"] for w in data["restore_warnings"]] == [99]
    assert [w["event_id"] for w in data["webhooks"]] == ["evt_1"]
    assert data["refunds"] == [] and data["proof_refusals"] == []
    kinds = [t["kind"] for t in data["timeline"]]
    assert kinds.count("transition") == 2 and "webhook" in kinds and "restore_warning" in kinds
    html = fresh_client.get(f"/console/orders/{ref.lower()}").get_data(as_text=True)
    # The JSON's timeline keeps the codes; the page says them in words (docs/REFERENCE.md, Console).
    assert "OrderCancelled" in [t["what"] for t in data["timeline"]]
    assert ref in html and "Order placed" in html and "Payment deadline scheduled" in html
    assert "OrderCancelled" not in html and "expire_unpaid_order armed" not in html
    r = fresh_client.get("/console/orders/BK-NOSUCH", headers=JSON)
    assert r.status_code == 404 and "BK-NOSUCH" in r.get_json()["error"]


def test_outbox_lists_dead_letters_in_the_contract_shape_with_the_traceback_on_demand(
    fresh_app, fresh_client, token, monkeypatch
):
    from shop.outbox.subscriptions import SUBSCRIPTIONS
    from shop.saga import HANDLERS

    def print_label(event, now):
        raise RuntimeError("label printer on fire")

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", ["print_label"])
    monkeypatch.setitem(HANDLERS, "print_label", print_label)
    order_id, ref = placed_order_in(fresh_app)
    with fresh_app.app_context():
        delivery = db.session.execute(
            select(OutboxDelivery.id).where(OutboxDelivery.handler == "print_label")
        ).scalar_one()
    start = utcnow()
    outcomes = [run_delivery(fresh_app, delivery, now=start + timedelta(minutes=i)) for i in range(5)]
    assert outcomes[-1] == "dead"

    data = fresh_client.get("/console/outbox?status=dead", headers=JSON).get_json()
    assert data["deliveries"] == [
        {
            "id": delivery,
            "event": "OrderPlaced",
            "handler": "print_label",
            "status": "dead",
            "attempts": 5,
            "last_error": "RuntimeError: label printer on fire",
            "order_reference": ref,
            "waiting_for_provider": False,
        }
    ]
    assert set(data["deliveries"][0]) == DELIVERY_KEYS
    assert fresh_client.get("/console/outbox?status=done", headers=JSON).get_json()["deliveries"] == []
    with fresh_app.app_context():
        deadline = db.session.execute(
            select(ScheduledCommand.id).where(ScheduledCommand.order_id == order_id)
        ).scalar_one()
    everything = fresh_client.get("/console/outbox", headers=JSON).get_json()["deliveries"]
    assert [d["id"] for d in everything] == [delivery, f"cmd-{deadline}"]  # the order's pending deadline
    assert all(set(d) == DELIVERY_KEYS for d in everything)
    assert fresh_client.get("/console/outbox?status=zombie", headers=JSON).status_code == 400
    html = fresh_client.get("/console/outbox?status=dead").get_data(as_text=True)
    assert "<details><summary>traceback</summary>" in html and "in print_label" in html


def test_dead_scheduled_commands_are_dead_letters_of_the_outbox_in_its_shape_and_routes(fresh_app, fresh_client, token):
    """A dead refund or email is a dead letter too: listed in /console/outbox with the contract's
    keys (id "cmd-<n>": commands and deliveries are numbered apart), acted on through the
    outbox's own retry and discard routes, and counted by shop_outbox_deliveries{status="dead"}."""
    order_id, ref = placed_order_in(fresh_app)
    with fresh_app.app_context():
        command = db.session.execute(select(ScheduledCommand).where(ScheduledCommand.order_id == order_id)).scalar_one()
        command.status, command.attempts, command.last_error = "dead", 5, "SMTPError: relay refused"
        db.session.commit()
        command_id = command.id
    data = fresh_client.get("/console/outbox?status=dead", headers=JSON).get_json()
    assert data["deliveries"] == [
        {
            "id": f"cmd-{command_id}",
            "event": None,
            "handler": "expire_unpaid_order",
            "status": "dead",
            "attempts": 5,
            "last_error": "SMTPError: relay refused",
            "order_reference": ref,
            "waiting_for_provider": False,
        }
    ]
    assert 'shop_outbox_deliveries{status="dead"} 1.0' in fresh_client.get("/metrics").get_data(as_text=True)
    html = fresh_client.get("/console/outbox?status=dead").get_data(as_text=True)
    assert f'action="/console/outbox/cmd-{command_id}/retry"' in html

    r = fresh_client.post(f"/console/outbox/cmd-{command_id}/retry", data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["id"] == f"cmd-{command_id}"  # the list's id, not delivery {command_id}
    assert ref in r.get_json()["message"] and "“Payment deadline” command" in r.get_json()["message"]
    with fresh_app.app_context():
        row = db.session.get(ScheduledCommand, command_id)
        assert (row.status, row.attempts) == ("pending", 0)
    assert 'shop_outbox_deliveries{status="dead"} 0.0' in fresh_client.get("/metrics").get_data(as_text=True)


@pytest.mark.parametrize(
    "url",
    [
        "/console/outbox/99999999999/retry",
        "/console/outbox/cmd-99999999999/discard",
        "/console/outbox/2147483648/retry",
        "/console/outbox/0/retry",
        "/console/outbox/cmd-x/retry",
        "/console/restore-warnings/2147483648/resolve",
    ],
)
def test_an_id_that_cannot_exist_is_a_404_not_a_database_error(fresh_app, fresh_client, token, url):
    r = fresh_client.post(url, data={"csrf_token": token, "reason": "x", "action": "fixed"}, headers=JSON)
    assert r.status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "/console/orders/BK-%00",
        "/console/orders/" + "X" * 300,
        "/console/webhooks?outcome=%00",
        "/console/webhooks?outcome=nope",
    ],
)
def test_text_that_cannot_be_a_reference_or_filter_is_answered_in_words(fresh_app, fresh_client, token, url):
    r = fresh_client.get(url, headers=JSON)
    assert r.status_code in (400, 404) and r.get_json()["error"]


# -- operator actions on dead letters --------------------------------------------------------


def test_retrying_a_dead_delivery_gives_it_a_fresh_budget_and_it_then_runs(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app, "MUG-350-NVY", 2)
    assert on_hand("MUG-350-NVY", fresh_app) == 1
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    assert run_delivery(fresh_app, delivery) == "skipped"  # dead, budget spent: nothing runs it
    assert on_hand("MUG-350-NVY", fresh_app) == 1

    r = fresh_client.post(f"/console/outbox/{delivery}/retry", data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["status"] == "pending"
    with fresh_app.app_context():
        row = db.session.get(OutboxDelivery, delivery)
        assert (row.status, row.attempts, row.max_attempts) == ("pending", 0, fresh_app.config["OUTBOX_MAX_ATTEMPTS"])

    assert run_delivery(fresh_app, delivery) == "done"
    assert on_hand("MUG-350-NVY", fresh_app) == 3
    with fresh_app.app_context():
        assert db.session.get(Order, order_id).inventory_restored is True


def test_a_browser_retry_goes_back_to_the_page_with_a_message(fresh_app, fresh_client, token):
    order_id, _ = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    r = fresh_client.post(
        f"/console/outbox/{delivery}/retry", data={"csrf_token": token, "next": "/console/outbox?status=dead"}
    )
    assert (
        r.status_code == 303 and r.headers["Location"] == f"/console/outbox?status=dead&keep={delivery}"
    )  # the row stays in view
    assert "fresh budget" in fresh_client.get(r.headers["Location"]).get_data(as_text=True)


def test_retry_and_discard_answer_404_for_an_unknown_row_and_409_for_one_that_is_not_dead(
    fresh_app, fresh_client, token
):
    order_id, _ = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)  # pending, not dead
    for action, data in (("retry", {}), ("discard", {"reason": "not needed"})):
        r = fresh_client.post(f"/console/outbox/987654/{action}", data={"csrf_token": token, **data}, headers=JSON)
        assert r.status_code == 404
        r = fresh_client.post(f"/console/outbox/{delivery}/{action}", data={"csrf_token": token, **data}, headers=JSON)
        assert r.status_code == 409 and r.get_json()["current_status"] == "pending"
        assert "is not dead (it is to do)" in r.get_json()["error"]  # the status in words
    with fresh_app.app_context():
        assert db.session.get(OutboxDelivery, delivery).status == "pending"


def test_discarding_needs_a_reason_and_then_the_dead_letter_is_discarded(fresh_app, fresh_client, token):
    order_id, _ = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    for reason in (None, "", "   "):
        data = {"csrf_token": token} if reason is None else {"csrf_token": token, "reason": reason}
        r = fresh_client.post(f"/console/outbox/{delivery}/discard", data=data, headers=JSON)
        assert r.status_code == 400 and "why" in r.get_json()["error"].lower()
    assert fresh_client.post(f"/console/outbox/{delivery}/discard", data={"csrf_token": token}).status_code == 400
    with fresh_app.app_context():
        assert db.session.get(OutboxDelivery, delivery).status == "dead"

    r = fresh_client.post(
        f"/console/outbox/{delivery}/discard",
        data={"csrf_token": token, "reason": "stock recounted by hand"},
        headers=JSON,
    )
    assert r.status_code == 200 and r.get_json()["status"] == "discarded"
    with fresh_app.app_context():
        row = db.session.get(OutboxDelivery, delivery)
        assert (row.status, row.discard_reason) == ("discarded", "stock recounted by hand")
    assert run_delivery(fresh_app, delivery) == "skipped"
    assert (
        fresh_client.post(f"/console/outbox/{delivery}/retry", data={"csrf_token": token}, headers=JSON).status_code
        == 409
    )


# -- restore warnings ------------------------------------------------------------------------


def test_restore_warnings_list_in_the_contract_shape(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    with fresh_app.app_context():
        db.session.add(RestoreWarning(order_id=order_id, variant_id=7, quantity=2, reason="no inventory row"))
        db.session.add(RestoreWarning(order_id=order_id, variant_id=8, quantity=1, reason="old", state="resolved"))
        db.session.commit()
    data = fresh_client.get("/console/restore-warnings?state=open", headers=JSON).get_json()
    assert len(data["warnings"]) == 1
    item = data["warnings"][0]
    assert set(item) == WARNING_KEYS
    assert {k: item[k] for k in ("order_reference", "variant_id", "quantity", "reason", "state")} == {
        "order_reference": ref,
        "variant_id": 7,
        "quantity": 2,
        "reason": "no inventory row",
        "state": "open",
    }
    assert len(fresh_client.get("/console/restore-warnings", headers=JSON).get_json()["warnings"]) == 2
    html = fresh_client.get("/console/restore-warnings?state=open").get_data(as_text=True)
    assert ref in html and "Retry the restore" in html and "Mark fixed" in html


def test_restore_warnings_are_searched_by_reference_reason_or_variant_and_downloaded(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    other_id, other = placed_order_in(fresh_app)
    with fresh_app.app_context():
        db.session.add(RestoreWarning(order_id=order_id, variant_id=7, quantity=2, reason="no inventory row"))
        db.session.add(RestoreWarning(order_id=other_id, variant_id=9000008, quantity=1, reason="over the ceiling"))
        db.session.commit()

    def refs(**query) -> list[str]:
        r = fresh_client.get("/console/restore-warnings", query_string=query, headers=JSON)
        assert r.status_code == 200, r.get_json()
        return [w["order_reference"] for w in r.get_json()["warnings"]]

    assert refs(q=ref[3:].lower()) == [ref]
    assert refs(q="CEILING") == [other]
    assert refs(q="9000008") == [other]  # a variant's id (no reference holds seven digits in a row)
    assert refs(q="ceiling", state="resolved") == []
    assert refs(**{"from": "2020-01-01", "to": "2020-01-31"}) == []
    bad = fresh_client.get("/console/restore-warnings?to=yesterday", headers=JSON)
    assert bad.status_code == 400 and bad.get_json()["warnings"] == []
    rows = fresh_client.get("/console/restore-warnings?format=csv&q=inventory").get_data(as_text=True).splitlines()
    assert rows[0] == "id,order_reference,variant_id,quantity,reason,state,resolution,created_at,resolved_at"
    assert len(rows) == 2 and f",{ref},7,2,no inventory row,open," in rows[1]
    assert "Download CSV" in fresh_client.get("/console/restore-warnings?q=x").get_data(as_text=True)


def test_resolving_with_retry_restores_stock_once_the_cause_is_fixed(fresh_app, fresh_client, token):
    order_id, warning_id, vid = make_overflow_warning(fresh_app)
    url = f"/console/restore-warnings/{warning_id}/resolve"

    # The cause is still there: the retry is refused again, the warning stays open (and once).
    r = fresh_client.post(url, data={"csrf_token": token, "action": "retry"}, headers=JSON)
    assert r.status_code == 200 and r.get_json()["state"] == "open"
    assert "refused" in r.get_json()["message"]
    with fresh_app.app_context():
        assert on_hand(vid) == MAX_ON_HAND
        assert db.session.get(RestoreWarning, warning_id).state == "open"
        assert "refused again" in db.session.get(RestoreWarning, warning_id).resolution
    assert len(fresh_client.get("/console/restore-warnings?state=open", headers=JSON).get_json()["warnings"]) == 1

    # The operator corrects the runaway count; now the retry gives the order's 2 units back.
    with fresh_app.app_context():
        db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == vid).values(on_hand=10))
        db.session.commit()
    r = fresh_client.post(url, data={"csrf_token": token, "action": "retry"}, headers=JSON)
    assert r.status_code == 200 and r.get_json()["state"] == "resolved"
    with fresh_app.app_context():
        assert on_hand(vid) == 12
        assert db.session.get(Order, order_id).inventory_restored is True
        assert db.session.get(RestoreWarning, warning_id).state == "resolved"
    assert fresh_client.get("/console/restore-warnings?state=open", headers=JSON).get_json()["warnings"] == []
    assert fresh_client.post(url, data={"csrf_token": token, "action": "retry"}, headers=JSON).status_code == 409
    with fresh_app.app_context():
        assert on_hand(vid) == 12  # never twice


def test_retrying_an_unmatched_variant_warning_keeps_it_open_and_restores_nothing_twice(fresh_app, fresh_client, token):
    order_id, _ = placed_order_in(fresh_app, "SOCK-M", 3)
    assert run_delivery(fresh_app, cancel_in(fresh_app, order_id)) == "done"
    assert on_hand("SOCK-M", fresh_app) == 30
    with fresh_app.app_context():
        warning = RestoreWarning(
            order_id=order_id,
            variant_id=424242,
            quantity=1,
            reason="no inventory row for this variant; quantity not restored",
        )
        db.session.add(warning)
        db.session.commit()
        warning_id = warning.id
    r = fresh_client.post(
        f"/console/restore-warnings/{warning_id}/resolve", data={"csrf_token": token, "action": "retry"}, headers=JSON
    )
    assert r.status_code == 200 and r.get_json()["state"] == "open"
    assert "by hand" in r.get_json()["message"]
    assert on_hand("SOCK-M", fresh_app) == 30


def test_resolving_as_fixed_closes_the_warning_with_the_operators_note(fresh_app, fresh_client, token):
    order_id, warning_id, vid = make_overflow_warning(fresh_app)
    url = f"/console/restore-warnings/{warning_id}/resolve"
    r = fresh_client.post(url, data={"csrf_token": token, "action": "delete"}, headers=JSON)
    assert r.status_code == 400 and "fixed" in r.get_json()["error"]
    r = fresh_client.post(
        url, data={"csrf_token": token, "action": "fixed", "note": "recounted shelf B: 14"}, headers=JSON
    )
    assert r.status_code == 200 and r.get_json()["state"] == "resolved"
    with fresh_app.app_context():
        warning = db.session.get(RestoreWarning, warning_id)
        assert warning.state == "resolved" and warning.resolved_at is not None
        assert "recounted shelf B: 14" in warning.resolution and EMAIL in warning.resolution
        assert on_hand(vid) == MAX_ON_HAND  # "fixed" touches no stock
    assert fresh_client.post(url, data={"csrf_token": token, "action": "fixed"}, headers=JSON).status_code == 409
    assert (
        fresh_client.post(
            "/console/restore-warnings/999999/resolve", data={"csrf_token": token, "action": "fixed"}, headers=JSON
        ).status_code
        == 404
    )


# -- reconcile against the provider ----------------------------------------------------------


def _started_order(fresh_paying_app):
    from shop.payments.start import start_payment

    order_id, ref = placed_order_in(fresh_paying_app)
    with fresh_paying_app.app_context():
        assert start_payment(order_id).status == "started"
        return order_id, ref, db.session.get(Order, order_id).payment_session_id


def test_reconcile_turns_an_order_paid_at_the_provider_paid(fresh_paying_app, sandbox):
    client = fresh_paying_app.test_client()
    token = log_in(fresh_paying_app, client)
    order_id, ref, session_id = _started_order(fresh_paying_app)
    sandbox.faults(drop_webhooks=10)  # the webhook never arrives: only the console can tell
    sandbox.set_outcome(session_id, "paid")

    r = client.post(f"/console/orders/{ref}/reconcile", data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["outcome"] == "paid" and r.get_json()["status"] == "Paid"
    with fresh_paying_app.app_context():
        assert db.session.get(Order, order_id).status == "Paid"
        assert (
            db.session.execute(
                select(OutboxEvent.name).where(OutboxEvent.order_id == order_id).order_by(OutboxEvent.id)
            )
            .scalars()
            .all()[-1]
            == "OrderPaid"
        )
    again = client.post(f"/console/orders/{ref}/reconcile", data={"csrf_token": token}, headers=JSON)
    assert again.status_code == 200 and again.get_json()["outcome"] == "noop"


def test_reconcile_with_the_provider_unreachable_is_a_503_in_words_and_changes_nothing(fresh_paying_app, sandbox):
    client = fresh_paying_app.test_client()
    token = log_in(fresh_paying_app, client)
    order_id, ref, session_id = _started_order(fresh_paying_app)
    sandbox.set_outcome(session_id, "paid")
    sandbox.faults(api_unavailable=True, drop_webhooks=10)

    r = client.post(f"/console/orders/{ref}/reconcile", data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 503
    assert "could not be reached" in r.get_json()["error"]
    html = client.post(f"/console/orders/{ref}/reconcile", data={"csrf_token": token})
    assert html.status_code == 503 and "could not be reached" in html.get_data(as_text=True)
    with fresh_paying_app.app_context():
        assert db.session.get(Order, order_id).status == "PaymentInitiated"
    assert (
        client.post("/console/orders/BK-NOSUCH/reconcile", data={"csrf_token": token}, headers=JSON).status_code == 404
    )


def test_reconcile_with_the_provider_hanging_answers_within_the_request_budget_and_changes_nothing(
    make_fresh_app, sandbox, monkeypatch
):
    # Background timeouts of 30 s and two SDK retries: only the request's own budget (2 s
    # here, 9 s by default) can bring the operator an answer in time.
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_SESSION_MIN_SECONDS=60,
        STRIPE_WEBHOOK_SECRET="whsec_test_secret",
        STRIPE_TIMEOUT_SECONDS=30,
        STRIPE_MAX_NETWORK_RETRIES=2,
        STRIPE_REQUEST_BUDGET_SECONDS=2.0,
    )
    client = app.test_client()
    token = log_in(app, client)
    order_id, ref, session_id = _started_order(app)
    sandbox.set_outcome(session_id, "paid")
    transport = ProviderTransportLog(monkeypatch)
    with sandbox.api_hanging():
        r = client.post(f"/console/orders/{ref}/reconcile", data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 503 and "could not be reached" in r.get_json()["error"], r.get_json()
    # What the operator waited on: requests the provider never answered, each given no more than
    # what was left of the request's 2 s, never the background's 30 s.
    assert transport.timeouts and all(t.read <= 2.0 for t in transport.timeouts), transport.timeouts
    transport.assert_within_deadline()
    with app.app_context():
        assert db.session.get(Order, order_id).status == "PaymentInitiated"
        assert guard.current().deadline is None  # outside a request: the sweep's own timeouts


# -- webhooks and sweeps ---------------------------------------------------------------------


def test_webhooks_page_lists_accepted_and_rejected_deliveries_newest_first(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    with fresh_app.app_context():
        db.session.add(
            WebhookReceipt(
                event_id="evt_ok",
                event_type="checkout.session.completed",
                outcome="accepted",
                reason="",
                order_id=order_id,
                http_status=200,
                received_at=utcnow() - timedelta(minutes=5),
            )
        )
        db.session.commit()
    r = fresh_client.post("/webhooks/stripe", data=b'{"id": "evt_x"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400  # no signature: rejected, and recorded
    data = fresh_client.get("/console/webhooks", headers=JSON).get_json()
    assert [w["outcome"] for w in data["webhooks"]] == ["rejected", "accepted"]
    assert data["webhooks"][0]["reason"] and data["webhooks"][1]["order_reference"] == ref
    assert [
        w["outcome"]
        for w in fresh_client.get("/console/webhooks?outcome=accepted", headers=JSON).get_json()["webhooks"]
    ] == ["accepted"]
    html = fresh_client.get("/console/webhooks").get_data(as_text=True)
    assert "rejected" in html and data["webhooks"][0]["reason"] in html


def test_sweeps_page_lists_cycles_with_per_pass_counts_newest_first(fresh_app, fresh_client, token):
    now = utcnow()
    with fresh_app.app_context():
        db.session.add(
            ReconciliationCycle(
                started_at=now - timedelta(minutes=20),
                finished_at=now - timedelta(minutes=19),
                cutoff=now,
                status="ok",
                expiry_counts={"cancelled": 3},
                provider_counts={"paid": 1, "failed": 0},
            )
        )
        db.session.add(
            ReconciliationCycle(
                started_at=now - timedelta(minutes=10), cutoff=now, status="failed", errors=["provider unreachable"]
            )
        )
        db.session.commit()
    data = fresh_client.get("/console/sweeps", headers=JSON).get_json()
    assert [c["status"] for c in data["cycles"]] == ["failed", "ok"]
    assert data["cycles"][1]["expiry_counts"] == {"cancelled": 3}
    assert data["cycles"][1]["provider_counts"] == {"paid": 1, "failed": 0}
    assert data["cycles"][1]["duration_seconds"] == 60.0
    html = fresh_client.get("/console/sweeps").get_data(as_text=True)
    assert "<strong>3</strong> cancelled" in html and "<strong>1</strong> paid" in html
    assert "provider unreachable" in html and "10 min ago" in html
    assert "failed" not in html.split("<strong>1</strong> paid", 1)[1].split("</td>", 1)[0]  # zeros are not listed


def test_every_console_page_renders_for_a_logged_in_operator(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    dead_letter(fresh_app, cancel_in(fresh_app, order_id))
    for url in [
        "/console/",
        "/console/orders",
        "/console/orders?stuck=1",
        f"/console/orders/{ref}",
        "/console/outbox?status=dead",
        "/console/outbox",
        "/console/restore-warnings?state=open",
        "/console/webhooks",
        "/console/sweeps",
    ]:
        r = fresh_client.get(url, headers=HTML)
        assert r.status_code == 200, url
        page = r.get_data(as_text=True)
        assert "Log out" in page and 'name="csrf_token"' in page, url


def test_retry_all_dead_of_one_kind_after_an_outage_moves_exactly_those(fresh_app, fresh_client, token):
    """After the mail server came back: one click retries every dead send_email, and nothing else."""
    order_id, ref = placed_order_in(fresh_app)
    with fresh_app.app_context():
        from shop.outbox import schedule_command

        now = utcnow()
        for _ in range(3):
            schedule_command(
                db.session, "send_email", now, order_id=order_id, payload={"template": "order_paid"}, now=now
            )
        db.session.commit()
        db.session.execute(
            update(ScheduledCommand)
            .where(ScheduledCommand.order_id == order_id)
            .values(status="dead", attempts=5, last_error="MailNotSent: the mail server ...")
        )
        db.session.commit()
        mails = sorted(db.session.scalars(select(ScheduledCommand.id).where(ScheduledCommand.kind == "send_email")))
        deadline = db.session.scalar(select(ScheduledCommand.id).where(ScheduledCommand.kind == "expire_unpaid_order"))
    page = fresh_client.get("/console/outbox?status=dead").get_data(as_text=True)
    assert "Retry all 3 dead: Email to the customer</button>" in page  # the kind in words, its code beside
    assert "Retry all 1 dead: Payment deadline</button>" in page and '<code class="small">send_email</code>' in page

    r = fresh_client.post(
        "/console/outbox/retry-dead", data={"csrf_token": token, "what": "command:send_email"}, headers=JSON
    )
    assert r.status_code == 200 and r.get_json()["retried"] == [f"cmd-{i}" for i in mails]
    with fresh_app.app_context():
        states = dict(db.session.execute(select(ScheduledCommand.id, ScheduledCommand.status)).all())
    assert [states[i] for i in mails] == ["pending"] * 3 and states[deadline] == "dead"
    assert (
        fresh_client.post(
            "/console/outbox/retry-dead", data={"csrf_token": token, "what": "nonsense"}, headers=JSON
        ).status_code
        == 400
    )


# -- search and audit --------------------------------------------------------------------------


def test_orders_are_found_by_reference_email_in_any_case_or_provider_session(fresh_app, fresh_client, token):
    first, ref = placed_order_in(fresh_app)
    _, other = placed_order_in(fresh_app)
    with fresh_app.app_context():
        force_order(first, email="Ann.Lee@Example.com", payment_session_id="cs_test_find_me")

    def found(q):
        return [
            o["reference"]
            for o in fresh_client.get("/console/orders", query_string={"q": q}, headers=JSON).get_json()["orders"]
        ]

    assert found(ref.lower()) == [ref]
    assert found("  ann.lee@example.COM ") == [ref]
    assert found("cs_test_find_me") == [ref]
    assert found("ann@example.com") == [other]
    assert found("nobody@example.com") == []
    assert "nobody@example.com" in fresh_client.get("/console/orders?q=nobody@example.com").get_data(as_text=True)


def test_every_console_action_leaves_an_audit_row_with_who_what_why_and_outcome(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    assert (
        fresh_client.post(
            f"/console/outbox/{delivery}/discard", data={"csrf_token": token, "reason": "recounted"}, headers=JSON
        ).status_code
        == 200
    )
    assert (
        fresh_client.post(f"/console/outbox/{delivery}/retry", data={"csrf_token": token}, headers=JSON).status_code
        == 409
    )  # refused actions are audited too
    assert (
        fresh_client.post(
            "/console/outbox/retry-dead", data={"csrf_token": token, "what": "command:send_email"}, headers=JSON
        ).status_code
        == 200
    )

    actions = fresh_client.get("/console/audit", headers=JSON).get_json()["actions"]
    assert [(a["operator"], a["action"], a["status"]) for a in actions] == [
        (EMAIL, "retry_all_dead", 200),
        (EMAIL, "retry_work", 409),
        (EMAIL, "discard_work", 200),
    ]
    discard = actions[-1]
    assert discard["reason"] == "recounted" and discard["order_reference"] == ref
    assert "discarded" in discard["outcome"] and discard["at"]
    assert "not dead" in actions[1]["outcome"]
    timeline = fresh_client.get(f"/console/orders/{ref}", headers=JSON).get_json()
    assert [a["action"] for a in timeline["operator_actions"]] == ["discard_work", "retry_work"]
    assert any(t["kind"] == "operator" and EMAIL in t["what"] for t in timeline["timeline"])
    page = fresh_client.get("/console/audit").get_data(as_text=True)
    assert "recounted" in page and EMAIL in page
    # How it went, in words: the HTTP status is only the badge's tooltip.
    assert '<span class="badge alert" title="HTTP 409">refused</span>' in page
    assert '<span class="badge ok" title="HTTP 200">done</span>' in page
    assert [
        a["action"]
        for a in fresh_client.get(f"/console/audit?operator={EMAIL.upper()}", headers=JSON).get_json()["actions"]
    ] == ["retry_all_dead", "retry_work", "discard_work"]


def test_the_audit_trail_is_searched_by_part_of_an_action_target_or_reference_and_by_date(
    fresh_app, fresh_client, token
):
    order_id, ref = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    fresh_client.post(f"/console/outbox/{delivery}/discard", data={"csrf_token": token, "reason": "recounted"})
    fresh_client.post("/console/outbox/retry-dead", data={"csrf_token": token, "what": "command:send_email"})

    def found(**query) -> list[str]:
        r = fresh_client.get("/console/audit", query_string=query, headers=JSON)
        assert r.status_code == 200, r.get_json()
        return [a["action"] for a in r.get_json()["actions"]]

    assert found(q=ref[3:].lower()) == ["discard_work"]  # part of the order's reference, any case
    assert found(q="retry all") == ["retry_all_dead"]  # the action as the page writes it
    assert found(q="send_email") == ["retry_all_dead"]  # its target
    assert found(q=EMAIL.split("@")[0].upper()) == ["retry_all_dead", "discard_work"]
    today = utcnow().date().isoformat()
    assert found(**{"from": today, "to": today}) == ["retry_all_dead", "discard_work"]
    assert found(**{"from": "2020-01-01", "to": "2020-01-02"}) == []
    bad = fresh_client.get("/console/audit?from=2026-13-01", headers=JSON)
    assert bad.status_code == 400 and bad.get_json()["actions"] == [] and "not a date" in bad.get_json()["error"]
    page = fresh_client.get(f"/console/audit?q={ref}").get_data(as_text=True)
    assert "Download CSV" in page and "recounted" in page
    rows = fresh_client.get(f"/console/audit?format=csv&q={ref}").get_data(as_text=True).splitlines()
    assert rows[0] == "id,at,operator,action,target,order_reference,reason,status,outcome"
    # The download is on the trail itself, its target the search that names the order.
    assert [r.split(",")[3] for r in rows[1:]] == ["export_csv", "discard_work"]
    assert ref in rows[2] and "recounted" in rows[2]


def test_logging_in_and_out_and_anonymous_posts_are_not_operator_actions(fresh_app, fresh_client, token):
    fresh_client.post("/console/logout", data={"csrf_token": token})
    anonymous = fresh_app.test_client()
    anonymous.post("/console/outbox/1/retry", data={})
    with fresh_app.app_context():
        from shop.models import OperatorAction

        assert db.session.query(OperatorAction).count() == 0


def test_a_paid_order_shows_no_stale_error_no_reconcile_button_and_no_pending_deadline(fresh_paying_app, sandbox):
    from shop.payments.apply import reconcile_order
    from shop.payments.start import start_payment
    from shop.provider import gateway

    app, client = fresh_paying_app, fresh_paying_app.test_client()
    token = log_in(app, client)
    order_id, ref = placed_order_in(app)
    with app.app_context():
        # A first attempt fails (the order gets a last error and a fresh deadline), the second pays.
        assert start_payment(order_id).status == "started"
        gateway.expire_session(db.session.get(Order, order_id).payment_session_id)
        assert reconcile_order(order_id, source="test").outcome == "payment_failed"
        assert db.session.get(Order, order_id).last_payment_error
        db.session.rollback()
        assert start_payment(order_id).status == "started"
        sandbox.set_outcome(db.session.get(Order, order_id).payment_session_id, "paid")
        assert reconcile_order(order_id, source="test").outcome == "paid"
        db.session.remove()

    data = client.get(f"/console/orders/{ref}", headers=JSON).get_json()
    assert data["order"]["status"] == "Paid" and data["order"]["last_payment_error"] is None
    deadlines = [c for c in data["commands"] if c["kind"] == "expire_unpaid_order"]
    assert deadlines and {c["status"] for c in deadlines} == {"obsolete"}
    assert any(
        t["what"] == "expire_unpaid_order retired" and "paid before its deadline" in t["detail"]
        for t in data["timeline"]
    )
    html = client.get(f"/console/orders/{ref}").get_data(as_text=True)
    assert "last error" not in html and "/reconcile" not in html and "Ask the provider now" not in html
    pending = client.get("/console/outbox?status=pending", headers=JSON).get_json()["deliveries"]
    assert not [d for d in pending if d["handler"] == "expire_unpaid_order"]
    assert token


# The walk posts to sample work ids that no row has: the order it places (and cancels, through the
# console's cancel) owns none of them.
@pytest.mark.usefixtures("no_order_placed_email")
def test_every_console_post_route_from_the_url_map_leaves_an_audit_row_naming_the_operator(
    fresh_app, fresh_client, token
):
    """Walked from the URL map, so an action added later is held to it too: each POST (accepted,
    refused or not found alike) adds exactly one row with the operator's email and the action's
    name, and the one on a real order shows on that order's timeline."""
    order_id, ref = placed_order_in(fresh_app)
    samples = {"work": "999999", "id": "999999", "default": ref}
    actions = [
        (
            rule.endpoint.removeprefix("console."),
            re.sub(r"<(?:(\w+):)?\w+>", lambda m: samples.get(m.group(1) or "default", ref), rule.rule),
        )
        for rule in fresh_app.url_map.iter_rules()
        if rule.endpoint.startswith("console.")
        and "POST" in rule.methods
        and rule.endpoint not in ("console.login", "console.logout")
    ]
    assert {"reconcile", "retry_work", "discard_work", "retry_all_dead", "resolve_warning"} <= {a for a, _ in actions}
    for n, (action, url) in enumerate(actions, 1):
        r = fresh_client.post(url, data={"csrf_token": token, "reason": "audit walk"}, headers=JSON)
        assert r.status_code < 500, (url, r.status_code)
        if action == "logout_everywhere":  # it ended this session too
            token = log_in_again(fresh_client)
        rows = fresh_client.get("/console/audit", headers=JSON).get_json()["actions"]
        assert len(rows) == n, (url, rows)
        assert (rows[0]["operator"], rows[0]["action"], rows[0]["status"]) == (EMAIL, action, r.status_code), url
        assert rows[0]["at"]
    timeline = fresh_client.get(f"/console/orders/{ref}", headers=JSON).get_json()
    on_the_order = [a for a, url in actions if f"/orders/{ref}/" in url]
    assert "reconcile" in on_the_order
    assert [a["action"] for a in timeline["operator_actions"]] == on_the_order
    assert any(t["kind"] == "operator" and EMAIL in t["what"] for t in timeline["timeline"])


def test_webhook_counts_per_outcome_stop_at_the_cap_and_say_so(fresh_app, fresh_client, token, monkeypatch):
    from shop.console import queries

    monkeypatch.setattr(queries, "COUNT_CAP", 2)
    with fresh_app.app_context():
        for i in range(3):
            db.session.add(WebhookReceipt(event_id=f"evt_{i}", outcome="rejected", reason="bad", http_status=400))
        db.session.add(WebhookReceipt(event_id="evt_ok", outcome="accepted", reason="", http_status=200))
        db.session.commit()
    data = fresh_client.get("/console/webhooks", headers=JSON).get_json()
    assert data["counts"] == {"rejected": 2, "accepted": 1} and data["counts_capped"] == ["rejected"]
    html = fresh_client.get("/console/webhooks", headers=HTML).get_data(as_text=True)
    assert "rejected (2+)</a>" in html and "applied (1)</a>" in html  # the outcomes in words
