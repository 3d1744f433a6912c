"""Every console action that goes through leaves its audit row (docs/REFERENCE.md, GET
/console/audit). The POST routes are walked from the app's URL map, so an action added later
without a way to make it succeed here fails this test rather than going unchecked; each is made
to succeed the way an operator would (its form, on a real paid order on the sandbox), and must add
exactly one row naming the operator, the action, its HTTP status and what it did.
(tests/web/test_console.py walks the same routes refused.)"""

from __future__ import annotations

import re

from compensation_support import dead_letter
from payment_helpers import JSON, paid_at_provider, post_webhook, run_everything
from payment_helpers import order_id as order_id_of
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import OutboxDelivery, RestoreWarning, ScheduledCommand, WebhookReceipt, WorkStatus
from shop.models.payments import Refund
from support import OPERATOR_EMAIL, log_in, log_in_again, rows_in

KEY = re.compile(r'name="request_key" value="([^"]+)"')
NOT_AUDITED = {"console.login", "console.logout"}  # they open and close the session the audit names


def _console_post_endpoints(app) -> set[str]:
    return {
        rule.endpoint
        for rule in app.url_map.iter_rules()
        if rule.endpoint.startswith("console.") and "POST" in rule.methods and rule.endpoint not in NOT_AUDITED
    }


def _work_to_act_on(app, order_id: int) -> dict:
    """Rows for the actions that need one: a dead delivery and a dead command, a restore warning,
    two failed refunds, a signed webhook receipt."""
    deliveries = [d.id for d in rows_in(app, OutboxDelivery, order_id=order_id)]
    assert len(deliveries) == 2, deliveries  # the order-placed email, the confirmation
    dead_letter(app, deliveries[0])  # the order-placed email's: the confirmation stays sent, to resend it
    with app.app_context():
        command = db.session.query(ScheduledCommand).filter_by(order_id=order_id).order_by(ScheduledCommand.id).first()
        assert command is not None  # the order's deadline
        command.status = WorkStatus.DEAD
        handler = db.session.get(OutboxDelivery, deliveries[0]).handler
        warning = RestoreWarning(order_id=order_id, variant_id=None, quantity=1, reason="counted short")
        failed = [
            Refund(
                order_id=order_id,
                session_id=f"cs_walk_{n}",
                amount=100,
                currency="usd",
                reason="late money",
                status="failed",
                failure_reason="expired_or_canceled_card",
                failed_at=utcnow(),
            )
            for n in range(2)
        ]
        db.session.add_all([warning, *failed])
        db.session.commit()
        receipt = db.session.query(WebhookReceipt).filter_by(signed=True).order_by(WebhookReceipt.id).first()
        assert receipt is not None
        found = {
            "deliveries": deliveries,
            "handler": handler,
            "command": command.id,
            "warning": warning.id,
            "refunds": [r.id for r in failed],
            "receipt": receipt.id,
        }
        db.session.remove()
    return found


def test_every_console_post_route_that_succeeds_writes_one_audit_row_saying_so(
    mail_folder, fresh_paying_app, shopper, sandbox
):
    app = fresh_paying_app
    order, event = paid_at_provider(shopper, sandbox)
    assert post_webhook(shopper.client, event).get_json()["outcome"] == "paid"
    run_everything(app)
    ref = order["reference"]
    order_id = order_id_of(app, ref)
    rows = _work_to_act_on(app, order_id)
    variant = next(iter(shopper.skus.values()))
    client = app.test_client()
    token = log_in(app, client)

    def post(url, **form):
        return client.post(url, data={"csrf_token": token, **form}, headers=JSON)

    def resend():
        confirm = client.get(f"/console/orders/{ref}/emails/resend?template=order_paid").get_data(as_text=True)
        return post(f"/console/orders/{ref}/emails/resend", template="order_paid", request_key=KEY.search(confirm)[1])

    def acknowledge():
        cards = client.get("/console/", headers=JSON).get_json()["cards"]
        red = next(c for c in cards if not c["ok"])
        return post(f"/console/cards/{red['key']}/acknowledge", reason="known", hours="1", condition=red["condition"])

    placed_email, confirmation = rows["deliveries"]

    def discard():  # once its email was resent: a dead confirmation is not a sent one
        dead_letter(app, confirmation)
        return post(f"/console/outbox/{confirmation}/discard", reason="sent by hand")

    live = shopper.place()  # a second order, still at the payment page: one an operator may cancel
    r1, r2 = rows["refunds"]
    succeed = {
        "console.reconcile": lambda: post(f"/console/orders/{ref}/reconcile"),
        "console.reapply_webhook": lambda: post(f"/console/webhooks/{rows['receipt']}/reapply", confirm="yes"),
        "console.refund": lambda: post(f"/console/orders/{ref}/refund", amount="100", reason="one sock torn"),
        "console.ship": lambda: post(f"/console/orders/{ref}/ship", tracking="1Z 999 AA1"),
        "console.cancel_order_now": lambda: post(f"/console/orders/{live['reference']}/cancel", reason="duplicate"),
        "console.resend_email": resend,
        "console.change_email": lambda: post(f"/console/orders/{ref}/email", email="new@example.com", reason="typo"),
        "console.retry_work": lambda: post(f"/console/outbox/cmd-{rows['command']}/retry"),
        "console.discard_work": discard,
        "console.retry_all_dead": lambda: post("/console/outbox/retry-dead", what=f"delivery:{rows['handler']}"),
        "console.resolve_warning": lambda: post(
            f"/console/restore-warnings/{rows['warning']}/resolve", action="fixed", note="+1 on the shelf"
        ),
        "console.retry_refund": lambda: post(f"/console/refunds/{r1}/retry", attempt="1"),
        "console.settle_refund": lambda: post(f"/console/refunds/{r2}/settle", reason="bank transfer"),
        "console.adjust_inventory": lambda: post(f"/console/inventory/{variant}/adjust", delta="+1", reason="found"),
        "console.acknowledge_card": acknowledge,
        "console.logout_everywhere": lambda: post("/console/logout-everywhere"),  # last: it ends this session
    }
    assert _console_post_endpoints(app) == set(succeed), "a console action without a way to succeed here"
    done = 0
    for endpoint, act in succeed.items():
        r = act()
        assert r.status_code < 400, (endpoint, r.status_code, r.get_data(as_text=True)[:300])
        if endpoint == "console.retry_all_dead":
            assert r.get_json()["retried"] == [placed_email]  # it did act, not just answer
        done += 1
        if endpoint == "console.logout_everywhere":
            token = log_in_again(client)
        actions = client.get("/console/audit", headers=JSON).get_json()["actions"]
        assert len(actions) == done, (endpoint, actions[:2])
        row = actions[0]
        assert (row["operator"], row["action"], row["status"]) == (
            OPERATOR_EMAIL,
            endpoint.removeprefix("console."),
            r.status_code,
        ), endpoint
        assert row["outcome"] and row["at"], (endpoint, row)
