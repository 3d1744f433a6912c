"""The evidence behind the console (docs/REFERENCE.md, Console): each webhook receipt keeps its raw body and the
address it came from, viewable in the console, with "re-apply" through the webhook's own guarded
path (an event already applied changes nothing, and says so); a payment start that failed is on
the order's timeline with the provider's words; the order page links to the provider's session."""

from __future__ import annotations

import json

from sqlalchemy import select

from payment_helpers import HTML, JSON, Shopper, paid_at_provider, post_webhook
from shop.extensions import db
from shop.models import OperatorAction, ProcessedStripeEvent, WebhookReceipt
from support import OPERATOR_EMAIL, log_in


def _receipt(app, **where) -> WebhookReceipt:
    with app.app_context():
        row = db.session.execute(select(WebhookReceipt).filter_by(**where).order_by(WebhookReceipt.id)).scalars()
        found = row.all()[-1]
        db.session.expunge(found)
        return found


def test_a_receipt_keeps_its_raw_body_and_source_address_for_the_console(fresh_paying_app, shopper, sandbox):
    order, event = paid_at_provider(shopper, sandbox)
    body = json.dumps(event).encode()
    r = post_webhook(shopper.client, body, headers={})
    assert r.status_code == 200
    sender = shopper.client.environ_base["REMOTE_ADDR"]  # each shopper has a client address of its own
    receipt = _receipt(fresh_paying_app, event_id=event["id"])
    assert receipt.body == body.decode() and receipt.signed is True and receipt.source_address == sender

    console = fresh_paying_app.test_client()
    log_in(fresh_paying_app, console)
    listed = console.get("/console/webhooks", headers=JSON).get_json()["webhooks"]
    assert listed[0]["id"] == receipt.id and listed[0]["source_address"] == sender
    assert "body" not in listed[0]  # the list does not carry bodies; the detail does
    detail = console.get(f"/console/webhooks/{receipt.id}", headers=JSON).get_json()
    assert detail["body"] == body.decode() and detail["reapplicable"] is True
    html = console.get(f"/console/webhooks/{receipt.id}", headers=HTML).get_data(as_text=True)
    assert event["id"] in html and "Re-apply" in html and 'name="confirm"' in html
    order_page = console.get(f"/console/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
    assert f'href="/console/webhooks/{receipt.id}"' in order_page  # the order's receipts link to their evidence
    assert console.get("/console/webhooks/999999", headers=JSON).status_code == 404
    assert console.get("/console/webhooks?signed=maybe", headers=JSON).status_code == 400


def test_re_applying_an_applied_event_changes_nothing_and_says_so_audited(fresh_paying_app, shopper, sandbox):
    order, event = paid_at_provider(shopper, sandbox)
    assert post_webhook(shopper.client, event).get_json()["outcome"] == "paid"
    before = shopper.order(order["reference"])
    receipt = _receipt(fresh_paying_app, event_id=event["id"])
    console = fresh_paying_app.test_client()
    token = log_in(fresh_paying_app, console)
    url = f"/console/webhooks/{receipt.id}/reapply"

    r = console.post(url, data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 400 and "confirm" in r.get_json()["error"]
    assert console.post(url, data={"confirm": "yes"}, headers=JSON).status_code == 400  # no CSRF token

    r = console.post(url, data={"csrf_token": token, "confirm": "yes"}, headers=JSON)
    assert r.status_code == 200, r.get_data(as_text=True)
    answer = r.get_json()
    assert answer["outcome"] == "duplicate" and answer["changed"] is False
    assert "already applied: nothing changed" in answer["message"]
    after = shopper.order(order["reference"])
    assert after["status"] == "Paid" and after["version"] == before["version"]
    with fresh_paying_app.app_context():
        assert db.session.query(ProcessedStripeEvent).filter_by(event_id=event["id"]).count() == 1
        [audited] = (
            db.session.execute(
                select(OperatorAction).where(OperatorAction.action == "reapply_webhook", OperatorAction.status == 200)
            )
            .scalars()
            .all()
        )
        assert audited.operator == OPERATOR_EMAIL and "already applied" in audited.outcome
        assert audited.target == f"webhook receipt #{receipt.id}"


def test_re_applying_an_event_that_failed_to_apply_applies_it(fresh_paying_app, shopper, sandbox):
    order, event = paid_at_provider(shopper, sandbox)
    with fresh_paying_app.app_context():  # as a delivery accepted but not applied leaves it
        db.session.add(
            WebhookReceipt(
                event_id=event["id"],
                event_type=event["type"],
                outcome="failed",
                reason="accepted, not applied: OperationalError: gone",
                http_status=200,
                body=json.dumps(event),
                signed=True,
                source_address="127.0.0.1",
            )
        )
        db.session.commit()
    receipt = _receipt(fresh_paying_app, event_id=event["id"])
    console = fresh_paying_app.test_client()
    token = log_in(fresh_paying_app, console)
    r = console.post(f"/console/webhooks/{receipt.id}/reapply", data={"csrf_token": token, "confirm": "yes"})
    assert r.status_code == 303
    assert shopper.order(order["reference"])["status"] == "Paid"
    page = console.get(r.headers["Location"], headers=HTML).get_data(as_text=True)
    assert "re-applied: paid" in page


def test_noise_cannot_be_re_applied(fresh_paying_app):
    client = fresh_paying_app.test_client()
    body = b'{"id": "evt_x", "type": "checkout.session.completed", "data": {"object": {"id": "cs_x"}}}'
    assert client.post("/webhooks/stripe", data=body, headers={"Content-Type": "application/json"}).status_code == 400
    receipt = _receipt(fresh_paying_app, outcome="rejected")
    console = fresh_paying_app.test_client()
    token = log_in(fresh_paying_app, console)
    form = {"csrf_token": token, "confirm": "yes"}
    r = console.post(f"/console/webhooks/{receipt.id}/reapply", data=form, headers=JSON)
    assert r.status_code == 409 and "signature verified" in r.get_json()["error"]
    detail = console.get(f"/console/webhooks/{receipt.id}", headers=JSON).get_json()
    assert detail["reapplicable"] is False and detail["signed"] is False and detail["body"] == body.decode()


def test_a_failed_payment_start_is_on_the_orders_timeline_with_the_providers_words(make_shop, sandbox):
    app = make_shop(sandbox=True)
    shopper = Shopper(app, app.skus)
    sandbox.faults(api_unavailable=True)
    ref = shopper.buy()
    r = shopper.pay(ref)  # "Pay now" during the outage: tried again
    assert r.status_code in (200, 202, 303, 503), r.get_data(as_text=True)
    console = app.test_client()
    log_in(app, console)
    data = console.get(f"/console/orders/{ref}", headers=JSON).get_json()
    failed = [t for t in data["timeline"] if t["kind"] == "payment_start_failed"]
    assert len(failed) == 2
    assert "did not start: provider unavailable" in failed[0]["what"]
    assert "503" in failed[0]["detail"] and "(code unreachable)" in failed[0]["detail"]
    assert [p["kind"] for p in data["provider_refusals"]] == ["unavailable", "unavailable"]
    html = console.get(f"/console/orders/{ref}", headers=HTML).get_data(as_text=True)
    assert "did not start: provider unavailable" in html


def test_the_order_page_links_to_the_providers_session(make_shop, sandbox):
    app = make_shop(sandbox=True)
    shopper = Shopper(app, app.skus)
    order = shopper.place()
    console = app.test_client()
    log_in(app, console)
    data = console.get(f"/console/orders/{order['reference']}", headers=JSON).get_json()
    assert data["provider_session_link"]["url"] == order["payment"]["url"]  # the sandbox's hosted page
    html = console.get(f"/console/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
    assert 'id="provider-session-link"' in html

    from shop.provider.links import session_link

    sid = order["payment"]["session_id"]
    with app.test_request_context():
        app.config.update(STRIPE_SECRET_KEY="sk_test_abc", STRIPE_API_BASE=None)
        assert session_link(sid, "x")["url"] == f"https://dashboard.stripe.com/test/checkout/sessions/{sid}"
        app.config.update(STRIPE_SECRET_KEY="sk_live_abc")
        assert session_link(sid, "x")["url"] == f"https://dashboard.stripe.com/checkout/sessions/{sid}"
        assert session_link(None, "x") is None


def test_a_receipts_body_and_address_are_pruned_with_the_receipt(make_fresh_app):
    from datetime import timedelta

    from shop.domain.deadlines import utcnow
    from shop.scheduling import retention

    app = make_fresh_app(RETENTION_DAYS=1)
    with app.app_context():
        now = utcnow()
        db.session.add(
            WebhookReceipt(
                outcome="rejected",
                reason="no Stripe-Signature header",
                http_status=400,
                signed=False,
                source_address="198.51.100.99",
                body='{"secret": "of a scanner"}',
                received_at=now,
            )
        )
        db.session.commit()
        assert retention.prune(now + timedelta(days=2)).counts["webhook_receipts"] == 0  # never under 7 days
        assert retention.prune(now + timedelta(days=8)).counts["webhook_receipts"] == 1
        assert db.session.execute(select(WebhookReceipt.id).where(WebhookReceipt.body.is_not(None))).first() is None
        assert db.session.query(WebhookReceipt).count() == 0
