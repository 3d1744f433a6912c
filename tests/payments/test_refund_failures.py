"""A refund is not done when the provider accepts it: it is pending until the provider says it
succeeded or failed, and one that fails is never silent. The late money of a cancelled order is
refunded while the sandbox keeps refunds pending, then the bank refuses it: by the webhook
(`refund.failed`), or, with that webhook dropped, by the sweep's watch asking the provider. Either
way the customer's page and email say what happened, the dashboard counts it, and an operator
either refunds again (once in all, whatever is resubmitted or redelivered) or records that it was
settled outside the shop, audited."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from factories import seed_catalog_rows
from payment_helpers import (
    JSON,
    Shopper,
    live_shop,
    order_id,
    post_webhook,
    run_due_commands,
    sandbox_event,
    stripe_event,
)
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import OperatorAction, Order, Refund, ScheduledCommand
from support import OPERATOR_EMAIL, log_in, mails, wait_until


def _refund(app, oid: int) -> Refund:
    with app.app_context():
        [refund] = db.session.execute(select(Refund).where(Refund.order_id == oid)).scalars().all()
        db.session.expunge(refund)
        db.session.remove()
        return refund


def _charge_at_sandbox(sandbox, payment_intent: str):
    """(amount, amount refunded, [(refund status, amount)]) of the payment at the sandbox."""
    with sandbox.sandbox.lock:
        state = sandbox.sandbox
        charge = state.charges[state.payment_intents[payment_intent].latest_charge]
        refunds = sorted(
            (r.seq, r.status, r.amount) for r in state.refunds.values() if r.payment_intent_id == payment_intent
        )
        return charge.amount, charge.amount_refunded, [(status, amount) for _, status, amount in refunds]


def _pending_late_money_refund(app, shopper, sandbox):
    """A customer pays by a method that settles later, cancels before it settles, and the money
    settles anyway: the shop refunds it while the sandbox keeps refunds pending. Returns the
    order's JSON, its id and the refund (pending at the provider, its id known)."""
    order = shopper.place("SOCK-M", 1)
    ref, sid = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(sid, "async_pending")
    assert shopper.cancel(ref, order["version"]).get_json()["status"] == "Cancelled"
    oid = order_id(app, ref)
    sandbox.faults(refunds_pending=True)
    sandbox.async_result(sid, "succeeded")  # its webhook makes the refund row and command

    def recorded():
        with app.app_context():
            found = db.session.execute(select(Refund.id).where(Refund.order_id == oid)).first()
            db.session.remove()
            return found

    wait_until(recorded, what="the late money's refund")
    run_due_commands(app, utcnow())  # the refund command: the provider answers "pending"
    refund = _refund(app, oid)
    assert refund.status == "pending" and refund.provider_refund_id and refund.attempts == 1
    return order, oid, refund


def _assert_the_pending_refund_is_not_shown_as_succeeded(shopper, ref, refund, mail_folder):
    page = shopper.order(ref)
    assert page["refunds"] == [{"id": refund.id, "amount": refund.amount, "status": "pending"}]
    html = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "is on its way" in html and "We refunded" not in html
    assert "Cancelled, refund on its way" in html
    assert mails(mail_folder, "refund_issued") == []


def _assert_the_failure_reached_the_operator_and_the_customer(
    app, shopper, operator, ref, refund, mail_folder, now=None
):
    failed = _refund(app, refund.order_id)
    assert (failed.status, failed.failure_reason) == ("failed", "expired_or_canceled_card")
    assert failed.provider_refund_id == refund.provider_refund_id and failed.failed_at is not None

    dashboard = operator.get("/console/", headers=JSON).get_json()
    assert dashboard["refunds_failed"] == 1
    [card] = [c for c in dashboard["cards"] if c["key"] == "refunds_failed"]
    assert (card["ok"], card["count"]) == (False, 1) and "did not go through" in card["words"]
    assert card["url"] == "/console/refunds?status=failed"
    assert 'id="card-refunds_failed"' in operator.get("/console/").get_data(as_text=True)
    listed = operator.get("/console/refunds?status=failed", headers=JSON).get_json()["refunds"]
    assert [(r["id"], r["order_reference"], r["needs_operator"], r["failure_reason"]) for r in listed] == [
        (refund.id, ref, True, "expired_or_canceled_card")
    ]
    timeline = operator.get(f"/console/orders/{ref}", headers=JSON).get_json()["timeline"]
    [entry] = [t for t in timeline if t["what"] == "refund failed at the provider"]
    assert refund.provider_refund_id in entry["detail"] and "expired_or_canceled_card" in entry["detail"]
    console_page = operator.get(f"/console/orders/{ref}").get_data(as_text=True)
    assert f'action="/console/refunds/{refund.id}/retry"' in console_page and 'name="attempt" value="1"' in console_page
    assert f'action="/console/refunds/{refund.id}/settle"' in console_page

    page = shopper.order(ref)
    assert page["refunds"] == [{"id": refund.id, "amount": refund.amount, "status": "failed"}]
    html = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "did not go through" in html and "has expired or was cancelled" in html and "contact us" in html
    assert "Cancelled, refund did not go through" in html

    run_due_commands(app, now or utcnow())  # the customer's email
    [mail] = mails(mail_folder, "refund_failed")
    assert mail["To"] == shopper.email and "did not go through" in mail["Subject"]
    body = mail.get_payload()
    assert "we are on it" in mail["Subject"].lower() or "working on" in body
    assert "contact us" in body and ref in body and "do not need to do anything" in body


def test_a_pending_refund_that_fails_by_webhook_is_shown_emailed_and_retried_through_the_console_once(
    make_fresh_app, sandbox, mail_folder
):
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        operator = app.test_client()
        token = log_in(app, operator)
        order, oid, refund = _pending_late_money_refund(app, shopper, sandbox)
        ref, total = order["reference"], order["total"]
        _assert_the_pending_refund_is_not_shown_as_succeeded(shopper, ref, refund, mail_folder)

        sandbox.refund_outcome(refund.provider_refund_id, "failed")  # refund.updated + refund.failed
        wait_until(lambda: _refund(app, oid).status == "failed", what="the refund.failed webhook")
        sandbox.wait_for_event("refund.failed")
        _assert_the_failure_reached_the_operator_and_the_customer(app, shopper, operator, ref, refund, mail_folder)

        # The operator presses Retry on the order's page; the same submission arrives again (as JSON).
        sandbox.faults(refunds_pending=False)
        back = f"/console/orders/{ref}"
        form = {"csrf_token": token, "attempt": 1, "confirm": "on", "next": back}
        first = operator.post(f"/console/refunds/{refund.id}/retry", data=form)
        assert (first.status_code, first.headers["Location"]) == (303, back)
        assert "as attempt 2" in operator.get(back).get_data(as_text=True)
        again = operator.post(f"/console/refunds/{refund.id}/retry", data=form, headers=JSON)
        assert again.status_code == 200, again.get_json()
        assert (again.get_json()["status"], again.get_json()["attempts"], again.get_json()["already"]) == (
            "pending",
            2,
            True,
        )
        with app.app_context():
            commands = (
                db.session.execute(
                    select(ScheduledCommand).where(
                        ScheduledCommand.order_id == oid, ScheduledCommand.kind == "refund_payment"
                    )
                )
                .scalars()
                .all()
            )
            assert len(commands) == 2  # the first attempt's and the retry's: one retry for two submissions
            db.session.remove()
        run_due_commands(app, utcnow())
        retried = _refund(app, oid)
        assert (retried.status, retried.attempts) == ("succeeded", 2)
        assert retried.provider_refund_id != refund.provider_refund_id

        # The first attempt's failure redelivered now changes nothing; a retry of a refund that
        # went through is refused; running the refund command again makes no third refund.
        stale = post_webhook(
            shopper.client,
            sandbox_event(sandbox, "refund.failed", refund.provider_refund_id),
            secret=_stored_secret(app),
        )
        assert stale.get_json()["outcome"] == "unknown_refund"
        late = operator.post(
            f"/console/refunds/{refund.id}/retry", data={"csrf_token": token, "attempt": 2}, headers=JSON
        )
        assert late.status_code == 409 and late.get_json()["current_status"] == "succeeded"
        run_due_commands(app, utcnow() + timedelta(minutes=5))
        assert _refund(app, oid).status == "succeeded"

        amount, refunded, at_provider = _charge_at_sandbox(sandbox, retried.payment_intent_id)
        assert (amount, refunded) == (total, total)  # refunded exactly once
        assert at_provider == [("failed", total), ("succeeded", total)]

        assert shopper.order(ref)["refunds"] == [{"id": refund.id, "amount": total, "status": "succeeded"}]
        assert "Cancelled, refunded" in shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
        assert operator.get("/console/", headers=JSON).get_json()["refunds_failed"] == 0
        assert len(mails(mail_folder, "refund_issued")) == 1
        with app.app_context():
            assert db.session.get(Order, oid).late_money_watch_since is None  # refunded: the watch ends
            actions = (
                db.session.execute(
                    select(OperatorAction).where(OperatorAction.order_id == oid).order_by(OperatorAction.id)
                )
                .scalars()
                .all()
            )
            assert [(a.action, a.status) for a in actions] == [
                ("retry_refund", 303),
                ("retry_refund", 200),
                ("retry_refund", 409),
            ]
            assert actions[0].operator == OPERATOR_EMAIL and "attempt 2" in actions[0].outcome
            db.session.remove()


def _stored_secret(app) -> str:
    from shop.models import KeyValue
    from shop.provider.registration import SECRET_KEY

    with app.app_context():
        value = db.session.get(KeyValue, SECRET_KEY).value
        db.session.remove()
        return value


def test_a_pending_refund_whose_failure_webhooks_are_lost_is_found_failed_by_the_sweeps_watch(
    make_fresh_app, sandbox, mail_folder
):
    from shop.scheduling.sweep import run_cycle

    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        operator = app.test_client()
        log_in(app, operator)
        order, oid, refund = _pending_late_money_refund(app, shopper, sandbox)
        ref = order["reference"]

        with app.app_context():  # the watch asks while the refund is pending, then backs off
            asked = run_cycle(now=utcnow() + timedelta(hours=1))
            assert asked.provider["refund_under_way"] == 1, asked.summary()
            assert db.session.get(Order, oid).provider_next_check_at is not None
            db.session.remove()
        assert _refund(app, oid).status == "pending"

        sandbox.faults(drop_webhooks=2)  # refund.updated and refund.failed never arrive
        sandbox.refund_outcome(refund.provider_refund_id, "failed")
        assert all(e["dropped"] for e in sandbox.events("refund.updated") + sandbox.events("refund.failed"))
        assert _refund(app, oid).status == "pending"

        with app.app_context():  # before its backoff is over the watch does not ask
            early = run_cycle(now=utcnow() + timedelta(hours=1, seconds=1))
            assert early.provider["refund_failed"] == 0
            db.session.remove()
        assert _refund(app, oid).status == "pending"
        later = utcnow() + timedelta(hours=3)
        with app.app_context():
            found = run_cycle(now=later)
            assert found.provider["refund_failed"] == 1, found.summary()
            db.session.remove()
        _assert_the_failure_reached_the_operator_and_the_customer(
            app, shopper, operator, ref, refund, mail_folder, now=later + timedelta(minutes=1)
        )
        with app.app_context():  # still watched: the money is not back
            assert db.session.get(Order, oid).late_money_watch_since is not None
            db.session.remove()


def test_settling_a_failed_refund_outside_the_shop_needs_a_reason_and_is_audited(make_fresh_app, sandbox, mail_folder):
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        operator = app.test_client()
        token = log_in(app, operator)
        order, oid, refund = _pending_late_money_refund(app, shopper, sandbox)
        ref = order["reference"]
        url = f"/console/refunds/{refund.id}/settle"

        pending = operator.post(url, data={"csrf_token": token, "reason": "sent by hand"}, headers=JSON)
        assert pending.status_code == 409 and pending.get_json()["current_status"] == "pending"
        sandbox.refund_outcome(refund.provider_refund_id, "failed")
        wait_until(lambda: _refund(app, oid).status == "failed", what="the refund.failed webhook")

        assert operator.post(url, data={"csrf_token": token}, headers=JSON).status_code == 400
        assert operator.post(url, data={"csrf_token": token, "reason": "   "}, headers=JSON).status_code == 400
        assert operator.post(url, data={"reason": "no token"}, headers=JSON).status_code == 400  # CSRF
        reason = "Bank transfer to the customer's new account, ref TX-4471"
        settled = operator.post(url, data={"csrf_token": token, "reason": reason}, headers=JSON)
        assert settled.status_code == 200, settled.get_json()
        body = settled.get_json()
        assert (body["status"], body["settled_by"], body["reason"], body["already"]) == (
            "failed",
            OPERATOR_EMAIL,
            reason,
            False,
        )
        assert body["settled_at"] and "settled outside the shop" in body["message"]
        again = operator.post(url, data={"csrf_token": token, "reason": reason}, headers=JSON)
        assert again.status_code == 200 and again.get_json()["already"] is True
        other = operator.post(url, data={"csrf_token": token, "reason": "something else"}, headers=JSON)
        assert other.status_code == 409
        retry = operator.post(f"/console/refunds/{refund.id}/retry", data={"csrf_token": token}, headers=JSON)
        assert retry.status_code == 409  # settled: nothing left to send

        row = _refund(app, oid)
        assert (row.status, row.settled_by, row.settlement_reason) == ("failed", OPERATOR_EMAIL, reason)
        dashboard = operator.get("/console/", headers=JSON).get_json()
        assert dashboard["refunds_failed"] == 0
        assert [c["ok"] for c in dashboard["cards"] if c["key"] == "refunds_failed"] == [True]
        assert operator.get("/console/refunds?status=failed", headers=JSON).get_json()["refunds"] == []
        assert [
            r["id"] for r in operator.get("/console/refunds?status=settled", headers=JSON).get_json()["refunds"]
        ] == [refund.id]
        audit = operator.get("/console/audit", headers=JSON).get_json()["actions"]
        settles = [(a["status"], a["reason"]) for a in reversed(audit) if a["action"] == "settle_refund"]
        # Every submission, refused ones too (the CSRF refusal before the view read its reason).
        assert settles == [
            (409, "sent by hand"),
            (400, None),
            (400, None),
            (400, None),
            (200, reason),
            (200, reason),
            (409, "something else"),
        ]
        assert {a["order_reference"] for a in audit if a["action"] == "settle_refund" and a["reason"]} == {ref}
        timeline = operator.get(f"/console/orders/{ref}", headers=JSON).get_json()["timeline"]
        assert any(t["what"] == "refund settled outside the shop" and reason in t["detail"] for t in timeline)
        assert any(t["kind"] == "operator" and t["what"] == f"settle_refund by {OPERATOR_EMAIL}" for t in timeline)

        # The customer's page says it was settled; the failure email, not sent before the operator
        # settled, is no longer true and is not sent at all.
        page = shopper.order(ref)
        assert page["refunds"][0]["status"] == "failed" and page["refunds_settled"] == [refund.id]
        html = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
        assert "we settled it with you directly" in html and "Cancelled, refunded" in html
        run_due_commands(app, utcnow())
        assert mails(mail_folder, "refund_failed") == []
        with app.app_context():
            assert db.session.get(Order, oid).late_money_watch_since is None  # settled: the watch ends
            db.session.remove()

        # The HTML form works the same (a browser's post, back to the order page).
        page = operator.get("/console/refunds?status=settled").get_data(as_text=True)
        assert "settled outside the shop by" in page


def test_a_refund_event_with_a_null_status_or_payment_intent_leaves_the_refund_pending(
    make_fresh_app, sandbox, mail_folder
):
    """Stripe's refund `status` and `payment_intent` are nullable: a report that says neither is
    not taken for money returned, and does not break the webhook."""
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        order, oid, refund = _pending_late_money_refund(app, shopper, sandbox)
        with app.app_context():
            from shop.provider import gateway

            snapshot = gateway.client().v1.refunds.retrieve(refund.provider_refund_id).to_dict()
            db.session.remove()
        snapshot.update(status=None, payment_intent=None)
        event = stripe_event("refund.updated", snapshot, event_id="evt_null_status")
        answer = post_webhook(shopper.client, event, secret=_stored_secret(app))
        assert answer.status_code == 200 and answer.get_json()["outcome"] == "noop"
        assert _refund(app, oid).status == "pending"
        assert shopper.order(order["reference"])["refunds"][0]["status"] == "pending"
