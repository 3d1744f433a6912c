"""The console's lists and dashboard in the shop's words: the refunds, webhooks and restore-warning
lists and the dashboard say a provider's decline, an event type, a state, a process's job and a
queue in words, and keep each code folded behind the row's "Technical detail" (still there to
search and copy); times show UTC in a <time> the browser adds local time beside. The JSON keeps
the codes."""

from __future__ import annotations

import html as entities
import re
from datetime import timedelta

from factories import force_order, placed_order_in, seed_catalog_rows
from shop.console import ops_words, words
from shop.domain.deadlines import utcnow
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import OperatorAction, Order, RestoreWarning, UnknownPaymentStatus, WarningState, WebhookReceipt
from shop.models.payments import Refund, UnknownPayment
from shop.provider.views import EVENT_TYPES
from support import leave_heartbeats

JSON = {"Accept": "application/json"}
TECHNICAL = re.compile(r'<details class="code-detail".*?</details>', re.S)
LOCAL_TIME = "data-beside>"  # words.when: the UTC text the browser puts local time beside


def shown_and_folded(page: str) -> tuple[str, str]:
    """The page's <main> as an operator reads it with every Technical detail closed, and the text
    of those folded details."""
    main = page.split("<main", 1)[1].split("</main>", 1)[0]
    folded = " ".join(TECHNICAL.findall(main))
    shown = re.sub(r"<[^>]+>", " ", TECHNICAL.sub("", main))
    return entities.unescape(shown), entities.unescape(folded)


def test_every_webhook_event_type_unknown_payment_and_warning_state_has_words():
    assert sorted(set(EVENT_TYPES) - set(words.WEBHOOK_EVENT_WORDS)) == []
    assert sorted(set(UnknownPaymentStatus) - set(words.UNKNOWN_PAYMENT_WORDS)) == []
    assert sorted(set(WarningState) - set(words.WARNING_WORDS)) == []
    assert [t for t in EVENT_TYPES if words.webhook_event_words(t) == t] == []
    assert words.webhook_event_words("charge.new_thing") == "charge.new_thing"  # unknown: shown as it is
    assert ops_words.job_words("drain(3)") == "running due event deliveries"
    assert ops_words.job_words("something_else(1)") == "something_else(1)"


def _failed_refund(app, reference_of) -> str:
    order_id, reference = reference_of
    with app.app_context():
        order = db.session.get(Order, order_id)
        db.session.add(
            Refund(
                order_id=order_id,
                session_id="cs_test_words",
                amount=order.total,
                currency=order.currency,
                reason="late money",
                status="failed",
                failure_reason="expired_or_canceled_card",
                failed_at=utcnow(),
                provider_refund_id="re_test_words",
            )
        )
        db.session.add(
            UnknownPayment(
                session_id="cs_test_unknown",
                reference="BK-NOTHERE",
                amount=1800,
                currency="usd",
                status=UnknownPaymentStatus.NOT_OURS,
                found_via="sweep: unknown money",
                detail="no shop mark",
            )
        )
        db.session.commit()
    return reference


def test_the_refunds_list_says_the_decline_and_status_in_words_with_the_codes_folded(fresh_app, fresh_client, token):
    reference = _failed_refund(fresh_app, placed_order_in(fresh_app))
    page = fresh_client.get("/console/refunds?status=failed").get_data(as_text=True)
    shown, folded = shown_and_folded(page)
    assert reference in shown
    assert "the card it would go back to has expired or was cancelled" in shown
    assert "did not go through" in shown  # the status, and its filter link
    assert "not this shop's payment page: needs an operator" in shown
    assert "the sweep's look at the provider's payments" in shown
    for code in ("expired_or_canceled_card", "re_test_words", "cs_test_words", "not_ours", "cs_test_unknown"):
        assert code not in shown, code
        assert code in folded, code
    assert page.count(LOCAL_TIME) >= 3  # failed at, created at, the unknown payment's found at
    data = fresh_client.get("/console/refunds?status=failed", headers=JSON).get_json()
    assert data["refunds"][0]["failure_reason"] == "expired_or_canceled_card"  # the JSON keeps codes


def test_the_webhooks_list_says_what_each_event_was_and_folds_its_type_and_http_status(fresh_app, fresh_client, token):
    with fresh_app.app_context():
        db.session.add(
            WebhookReceipt(
                event_id="evt_words_1",
                event_type="checkout.session.completed",
                outcome="accepted",
                reason="",
                http_status=200,
            )
        )
        db.session.add(
            WebhookReceipt(
                event_id="evt_words_2",
                event_type="checkout.session.expired",
                outcome="duplicate",
                reason="already applied",
                http_status=200,
            )
        )
        db.session.commit()
    page = fresh_client.get("/console/webhooks").get_data(as_text=True)
    shown, folded = shown_and_folded(page)
    assert "Payment page completed" in shown and "Payment page expired" in shown
    assert "already applied" in shown and "applied (1)" in shown  # outcomes, and the filter's counts
    for code in ("checkout.session.completed", "checkout.session.expired", "evt_words_1", "duplicate"):
        assert code not in shown, code
        assert code in folded, code
    assert LOCAL_TIME in page
    types = [w["event_type"] for w in fresh_client.get("/console/webhooks", headers=JSON).get_json()["webhooks"]]
    assert sorted(types) == ["checkout.session.completed", "checkout.session.expired"]


def test_the_restore_warnings_list_says_states_in_words_with_when_it_was_raised(fresh_app, fresh_client, token):
    order_id, reference = placed_order_in(fresh_app)
    with fresh_app.app_context():
        db.session.add(RestoreWarning(order_id=order_id, variant_id=7, quantity=2, reason="no inventory row"))
        db.session.add(
            RestoreWarning(
                order_id=order_id,
                variant_id=7,
                quantity=2,
                reason="no inventory row",
                state=WarningState.DUPLICATE,
                resolution="same problem as warning 1",
                resolved_at=utcnow(),
            )
        )
        db.session.commit()
    page = fresh_client.get("/console/restore-warnings").get_data(as_text=True)
    shown, folded = shown_and_folded(page)
    assert reference in shown and "variant 7" in shown
    assert "same as another warning" in shown and "same problem as warning 1" in shown
    assert "duplicate" not in shown and "duplicate" in folded
    assert page.count(LOCAL_TIME) >= 3  # each raised, and the duplicate's settling


def test_the_dashboard_says_stuck_states_processes_and_queues_in_words_with_their_codes_folded(
    fresh_app, fresh_client, token
):
    leave_heartbeats(fresh_app)
    order_id, _ = placed_order_in(fresh_app)
    with fresh_app.app_context():
        force_order(order_id, status=OrderStatus.PAYMENT_INITIATED, updated_at=utcnow() - timedelta(days=1))
        db.session.remove()
    page = fresh_client.get("/console/").get_data(as_text=True)
    shown, folded = shown_and_folded(page)
    assert "At the payment page" in shown  # the stuck order's state, as the customer reads it
    assert "Worker" in shown and "Scheduler" in shown
    assert "Work jobs (deliveries and commands)" in shown and "Timed jobs" in shown
    data = fresh_client.get("/console/", headers=JSON).get_json()
    codes = {p["state"] for p in data["processes"]} | {q["name"] for q in data["queues"] if q["kind"] != "database"}
    codes |= {"PaymentInitiated", "rq queue"}
    for code in sorted(codes):
        assert code not in shown, code
    for code in sorted(codes - {"PaymentInitiated"}):
        assert code in folded, code
    assert data["stuck_orders"]["by_status"]["PaymentInitiated"]["count"] == 1  # the JSON keeps its codes


def test_the_order_timeline_names_a_webhook_by_what_it_said_and_an_action_in_words(fresh_app, fresh_client, token):
    order_id, reference = placed_order_in(fresh_app)
    with fresh_app.app_context():
        db.session.add(
            WebhookReceipt(
                event_id="evt_timeline",
                event_type="checkout.session.expired",
                outcome="accepted",
                reason="",
                http_status=200,
                order_id=order_id,
            )
        )
        db.session.add(
            OperatorAction(
                operator="ops@example.com",
                action="retry_refund",
                target="refund 1",
                order_id=order_id,
                status=303,
                outcome="sent again",
                created_at=utcnow(),
            )
        )
        db.session.commit()
    page = fresh_client.get(f"/console/orders/{reference}").get_data(as_text=True)
    timeline = page.split('class="console-table timeline"', 1)[1].split("</table>", 1)[0]
    assert "Payment page expired: applied" in timeline and "retry refund by ops@example.com" in timeline
    assert "checkout.session.expired" not in timeline and "retry_refund" not in timeline
    data = fresh_client.get(f"/console/orders/{reference}", headers=JSON).get_json()
    whats = [t["what"] for t in data["timeline"]]
    assert "checkout.session.expired: accepted" in whats and "retry_refund by ops@example.com" in whats


def test_a_stock_correction_says_how_it_was_made_in_words(fresh_app, fresh_client, token):
    variant = seed_catalog_rows(fresh_app)["SOCK-M"]
    r = fresh_client.post(
        f"/console/inventory/{variant}/adjust", data={"csrf_token": token, "delta": "+2", "reason": "found two"}
    )
    assert r.status_code == 303
    shown, _ = shown_and_folded(fresh_client.get(f"/console/inventory/{variant}").get_data(as_text=True))
    assert "(+2, adjusted)" in shown and "(+2, adjust)" not in shown
    modes = [
        c["mode"] for c in fresh_client.get(f"/console/inventory/{variant}", headers=JSON).get_json()["corrections"]
    ]
    assert modes == ["adjust"]  # the JSON keeps the code
