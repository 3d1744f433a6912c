"""POST /webhooks/stripe as a delivery contract: what it rejects (and how loudly), what it
accepts, and that redelivery and disorder change an order at most once.

Events are the sandbox's own (a real session paid through the real SDK), posted through the
test client with a Stripe signature; hand-built events only where the sandbox cannot produce
the case (a lying amount, an unknown order)."""

from __future__ import annotations

import copy
import json
import logging
import time

import pytest

from payment_helpers import WEBHOOK_SECRET, order_id, paid_at_provider, post_webhook, signature, stripe_event
from shop.extensions import db
from shop.models import OutboxEvent, PaymentProofRefusal, ProcessedStripeEvent, WebhookReceipt

LOST = "every payment update is being lost"


def _receipts(app) -> list[tuple]:
    with app.app_context():
        rows = db.session.query(WebhookReceipt).order_by(WebhookReceipt.id).all()
        out = [(r.event_id, r.outcome, r.http_status, r.reason) for r in rows]
        db.session.remove()
        return out


def _order_events(app, ref) -> list[str]:
    oid = order_id(app, ref)
    with app.app_context():
        names = [e.name for e in db.session.query(OutboxEvent).filter_by(order_id=oid).order_by(OutboxEvent.id)]
        db.session.remove()
        return names


# -- accepted deliveries ---------------------------------------------------------------------


def test_the_same_completed_event_delivered_five_times_pays_the_order_once(fresh_paying_app, shopper, sandbox):
    order, event = paid_at_provider(shopper, sandbox)
    answers = [post_webhook(shopper.client, event) for _ in range(5)]
    assert [r.status_code for r in answers] == [200] * 5
    assert [r.get_json()["outcome"] for r in answers] == ["paid"] + ["duplicate"] * 4

    now = shopper.order(order["reference"])
    assert now["status"] == "Paid"
    assert now["version"] == order["version"] + 1  # one transition
    assert _order_events(fresh_paying_app, order["reference"]).count("OrderPaid") == 1
    receipts = _receipts(fresh_paying_app)
    assert [(r[0], r[1]) for r in receipts] == [(event["id"], "accepted")] + [(event["id"], "duplicate")] * 4
    with fresh_paying_app.app_context():
        assert db.session.query(ProcessedStripeEvent).filter_by(event_id=event["id"]).count() == 1


def test_an_expired_event_after_completed_changes_nothing(fresh_paying_app, shopper, sandbox):
    order, completed = paid_at_provider(shopper, sandbox)
    assert post_webhook(shopper.client, completed).status_code == 200
    paid = shopper.order(order["reference"])
    assert paid["status"] == "Paid"

    # Stripe does not order deliveries: an expiry notice for this session arriving late (here a
    # stale snapshot of it, as an out-of-order delivery would carry) must not undo the payment.
    stale = copy.deepcopy(completed["data"]["object"])
    stale.update(status="expired", payment_status="unpaid")
    expired = stripe_event("checkout.session.expired", stale, event_id="evt_late_expired")
    r = post_webhook(shopper.client, expired)
    assert r.status_code == 200, r.get_data(as_text=True)

    after = shopper.order(order["reference"])
    assert after["status"] == "Paid"
    assert after["version"] == paid["version"]
    events = _order_events(fresh_paying_app, order["reference"])
    assert events.count("OrderPaid") == 1 and "OrderPaymentFailed" not in events
    assert [r[1] for r in _receipts(fresh_paying_app)] == ["accepted", "accepted"]


def test_an_expired_event_whose_session_was_paid_meanwhile_pays_the_order(fresh_paying_app, shopper, sandbox):
    """The expired snapshot is stale and the completed event never came: what the provider says
    now (paid) wins over what the event carried."""
    order, completed = paid_at_provider(shopper, sandbox)
    stale = copy.deepcopy(completed["data"]["object"])
    stale.update(status="expired", payment_status="unpaid")
    r = post_webhook(shopper.client, stripe_event("checkout.session.expired", stale, event_id="evt_stale"))
    assert r.status_code == 200
    assert shopper.order(order["reference"])["status"] == "Paid"


@pytest.mark.parametrize("lie", [{"amount_total": 100}, {"currency": "eur"}], ids=["amount", "currency"])
def test_a_session_that_does_not_prove_the_order_total_is_refused_and_recorded(
    fresh_paying_app, shopper, sandbox, caplog, lie
):
    order, completed = paid_at_provider(shopper, sandbox)
    forged = copy.deepcopy(completed)
    forged["id"] = "evt_mismatch"
    forged["data"]["object"].update(lie)
    with caplog.at_level(logging.WARNING):
        r = post_webhook(shopper.client, forged)
    assert r.status_code == 200
    assert r.get_json()["outcome"] == "proof_refused"

    after = shopper.order(order["reference"])
    assert after["status"] == "PaymentInitiated"
    assert after["version"] == order["version"]
    oid = order_id(fresh_paying_app, order["reference"])
    with fresh_paying_app.app_context():
        refusal = db.session.query(PaymentProofRefusal).one()
        assert refusal.order_id == oid
        assert refusal.session_id == order["payment"]["session_id"]
        assert refusal.source == "webhook"
        field = next(iter(lie))
        assert field in refusal.problems
    warned = [
        rec for rec in caplog.records if rec.levelno == logging.WARNING and "payment proof refused" in rec.getMessage()
    ]
    assert warned and order["reference"] in warned[0].getMessage()


def test_an_event_for_an_order_we_do_not_know_is_accepted_with_a_warning(fresh_paying_app, shopper, sandbox, caplog):
    _, completed = paid_at_provider(shopper, sandbox)
    foreign = copy.deepcopy(completed)
    foreign["id"] = "evt_foreign"
    foreign["data"]["object"].update(
        metadata={"order_id": "987654"}, client_reference_id="BK-NOSUCH", id="cs_test_someone_elses"
    )
    with caplog.at_level(logging.WARNING):
        r = post_webhook(shopper.client, foreign)
    assert r.status_code == 200
    assert r.get_json()["outcome"] == "unknown_order"
    assert any(rec.levelno == logging.WARNING and "unknown order" in rec.getMessage() for rec in caplog.records)
    [receipt] = _receipts(fresh_paying_app)
    assert receipt[:3] == ("evt_foreign", "accepted", 200) and "unknown_order" in receipt[3]


def test_an_event_type_the_shop_does_not_use_is_acknowledged(fresh_paying_app, shopper):
    event = stripe_event("payment_intent.created", {"id": "pi_1", "object": "payment_intent"}, "evt_other")
    r = post_webhook(shopper.client, event)
    assert r.status_code == 200
    assert _receipts(fresh_paying_app)[0][:3] == ("evt_other", "ignored", 200)


# -- rejected deliveries ---------------------------------------------------------------------


def _event_body() -> bytes:
    session = {
        "id": "cs_test_x",
        "object": "checkout.session",
        "status": "complete",
        "payment_status": "paid",
        "amount_total": 1400,
        "currency": "usd",
        "metadata": {"order_id": "1"},
    }
    return json.dumps(stripe_event("checkout.session.completed", session, "evt_rejected")).encode()


REJECTIONS = {
    "no signature": lambda: (_event_body(), {}),
    "bad signature": lambda: (_event_body(), {"Stripe-Signature": signature(_event_body(), "whsec_someone_else")}),
    "malformed signature header": lambda: (_event_body(), {"Stripe-Signature": "nonsense"}),
    "stale timestamp": lambda: (
        _event_body(),
        {"Stripe-Signature": signature(_event_body(), timestamp=int(time.time()) - 3600)},
    ),
    "empty body": lambda: (b"", {"Stripe-Signature": signature(b"")}),
    "unparseable body": lambda: (b"{not json", {"Stripe-Signature": signature(b"{not json")}),
    "not utf-8": lambda: (b"\xff\xfe{}", {"Stripe-Signature": signature(b"\xff\xfe{}")}),
    "json but not an event": lambda: (b"[1, 2]", {"Stripe-Signature": signature(b"[1, 2]")}),
}


# Signed with this shop's secret and still unusable: the provider's own update is being lost.
SIGNED_REJECTIONS = {"unparseable body", "json but not an event"}


@pytest.mark.parametrize("case", list(REJECTIONS))
def test_an_unverifiable_delivery_is_rejected_with_400_and_recorded_critical_only_when_signed(
    fresh_paying_app, case, caplog
):
    body, headers = REJECTIONS[case]()
    client = fresh_paying_app.test_client()
    with caplog.at_level(logging.WARNING):
        r = client.post(
            "/webhooks/stripe",
            data=body,
            headers={"Content-Type": "application/json", **headers},
            environ_base={"REMOTE_ADDR": "203.0.113.9"},
        )
    assert r.status_code == 400, r.get_data(as_text=True)
    critical = [rec for rec in caplog.records if rec.levelno == logging.CRITICAL]
    signed = case in SIGNED_REJECTIONS
    if signed:
        assert len(critical) == 1 and LOST in critical[0].getMessage()
    else:  # noise from the internet: a WARNING naming where it came from, never "being lost"
        assert critical == []
        [warning] = [rec for rec in caplog.records if rec.name == "shop.webhooks"]
        assert warning.levelno == logging.WARNING and "203.0.113.9" in warning.getMessage()
    [receipt] = _receipts(fresh_paying_app)
    assert receipt[1:3] == ("rejected", 400)
    with fresh_paying_app.app_context():
        assert db.session.query(ProcessedStripeEvent).count() == 0
        row = db.session.query(WebhookReceipt).one()
        assert row.signed is signed and row.source_address == "203.0.113.9"
        assert (row.body or "") == body.decode("utf-8", "replace")


def test_without_a_signing_secret_every_delivery_is_rejected_loudly(make_fresh_app, caplog):
    app = make_fresh_app(STRIPE_WEBHOOK_SECRET=None)  # and none stored by registration
    body = _event_body()
    with caplog.at_level(logging.WARNING):
        r = post_webhook(app.test_client(), body)
    assert r.status_code == 400
    critical = [rec for rec in caplog.records if rec.levelno == logging.CRITICAL]
    assert len(critical) == 1 and LOST in critical[0].getMessage()
    assert "no signing secret" in critical[0].getMessage()
    [receipt] = _receipts(app)
    assert receipt[1:3] == ("rejected", 400) and "no signing secret" in receipt[3]


def test_a_body_over_a_million_bytes_gets_413_before_any_verification(fresh_paying_app, caplog):
    body = b'{"pad": "' + b"x" * 1_000_000 + b'"}'
    client = fresh_paying_app.test_client()
    with caplog.at_level(logging.WARNING):
        # No signature at all: a 400 would mean the signature was looked at first.
        r = client.post("/webhooks/stripe", data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert not any(rec.levelno == logging.CRITICAL for rec in caplog.records)  # unverified: noise
    assert any("over 1000000 bytes" in rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING)
    [receipt] = _receipts(fresh_paying_app)
    assert receipt[1:3] == ("rejected", 413)


def test_a_body_of_exactly_a_million_bytes_is_read_and_verified(fresh_paying_app):
    body = b'{"pad": "' + b"x" * (1_000_000 - 11) + b'"}'
    assert len(body) == 1_000_000
    r = post_webhook(fresh_paying_app.test_client(), body)
    assert r.status_code == 400  # read in full, verified, then found not to be an event
    assert _receipts(fresh_paying_app)[0][3].startswith("unparseable body")


def test_the_secret_stored_by_registration_verifies_deliveries(make_fresh_app, sandbox):
    from shop.models import KeyValue

    app = make_fresh_app(STRIPE_WEBHOOK_SECRET=None, STRIPE_API_BASE=sandbox.base_url)
    with app.app_context():
        db.session.add(KeyValue(key="stripe_webhook_secret", value="whsec_stored"))
        db.session.commit()
    event = stripe_event("payment_intent.created", {"id": "pi_1"}, "evt_stored")
    assert post_webhook(app.test_client(), event, secret="whsec_stored").status_code == 200
    assert post_webhook(app.test_client(), event, secret=WEBHOOK_SECRET).status_code == 400


# -- hostile but signed, and bodies without a Content-Length ----------------------------------


def _post_chunked(base_url: str, body: bytes, headers: dict, chunk: int = 64 * 1024):
    """A POST with Transfer-Encoding: chunked (no Content-Length), as a proxy may forward it."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(base_url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        conn.putrequest("POST", "/webhooks/stripe")
        for name, value in {**headers, "Transfer-Encoding": "chunked", "Content-Type": "application/json"}.items():
            conn.putheader(name, value)
        conn.endheaders()
        try:
            for start in range(0, len(body), chunk):
                piece = body[start : start + chunk]
                conn.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (413) and closed without reading the rest
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_chunked_body_is_measured_whole_413_over_the_limit_and_verified_whole_under_it(make_fresh_app):
    """Without a Content-Length the size is only known by reading: a body over the limit must not
    be cut at the limit and then judged by its first million bytes (a 400 for a bad signature)."""
    from payment_helpers import served

    with served(lambda base: make_fresh_app(STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET, PUBLIC_BASE_URL=base)) as (app, base):
        big = b'{"pad": "' + b"x" * 1_500_000 + b'"}'
        status, _ = _post_chunked(base, big, {"Stripe-Signature": signature(big)})
        assert status == 413
        just_over = b'{"pad": "' + b"x" * (1_000_001 - 11) + b'"}'
        assert _post_chunked(base, just_over, {"Stripe-Signature": signature(just_over)})[0] == 413

        # Under the limit and in many chunks: read to the end, so its signature verifies.
        event = stripe_event(
            "checkout.session.completed",
            {
                "id": "cs_test_chunked",
                "object": "checkout.session",
                "status": "complete",
                "payment_status": "paid",
                "amount_total": 100,
                "currency": "usd",
                "client_reference_id": "BK-NOSUCH",
                "metadata": {"pad": "y" * 300_000},
            },
            event_id="evt_chunked",
        )
        body = json.dumps(event).encode()
        status, answer = _post_chunked(base, body, {"Stripe-Signature": signature(body)}, chunk=4096)
        assert status == 200 and json.loads(answer)["outcome"] == "unknown_order"
    assert [(r[0], r[1], r[2]) for r in _receipts(app)] == [
        (None, "rejected", 413),
        (None, "rejected", 413),
        ("evt_chunked", "accepted", 200),
    ]


@pytest.mark.parametrize("shape", ["deep_array", "deep_object", "metadata_list", "fields_of_every_wrong_type"])
def test_a_signed_body_of_any_shape_is_answered_400_or_200_never_500(fresh_paying_app, shape):
    """Only Stripe can sign, but a 500 would make it retry forever: nesting past the parser's
    depth is unparseable (400), a session object with fields of the wrong types is a notice
    about no order we know, or about no session at all (200)."""
    session = {
        "id": "cs_test_odd",
        "object": "checkout.session",
        "status": "complete",
        "payment_status": "paid",
        "amount_total": 100,
        "currency": "usd",
        "client_reference_id": "BK-NOSUCH",
    }
    if shape == "deep_array":
        body = b"[" * 5000 + b"]" * 5000
    elif shape == "deep_object":
        nested = '{"a": ' * 5000 + "1" + "}" * 5000
        body = ('{"id": "evt_deep", "type": "checkout.session.completed", "data": {"object": ' + nested + "}}").encode()
    elif shape == "metadata_list":
        body = json.dumps(
            stripe_event("checkout.session.completed", {**session, "metadata": [1]}, event_id="evt_list")
        ).encode()
    else:
        odd = {
            "id": ["cs"],
            "status": 1,
            "payment_status": {"x": 1},
            "amount_total": "100",
            "currency": 5,
            "client_reference_id": "BK-\u0000",
            "metadata": {"order_id": {"x": 1}},
            "expires_at": 10**30,
            "payment_intent": {"id": 7},
            "url": False,
        }
        body = json.dumps(stripe_event("checkout.session.completed", odd, event_id="evt_odd")).encode()
    r = post_webhook(fresh_paying_app.test_client(), body)
    assert r.status_code in (200, 400), r.get_data(as_text=True)[:300]
    if shape.startswith("deep"):
        assert r.status_code == 400
    elif shape == "metadata_list":
        assert r.status_code == 200 and r.get_json()["outcome"] == "unknown_order"
    else:  # its session id is a list: the event names no session
        assert r.status_code == 200 and r.get_json()["outcome"] == "ignored"


def test_a_signed_event_whose_id_holds_a_control_character_is_refused_as_not_stripes(fresh_paying_app, caplog):
    """Found by the long fuzz run: an event id with a NUL passed the shape check, then PostgreSQL
    refused to store it while claiming the event, and the delivery was logged with a traceback as
    'accepted, not applied'. Stripe's ids are `evt_` and letters and digits: such a body is not
    Stripe's, and is refused before anything is written."""
    session = {
        "id": "cs_test_nul",
        "object": "checkout.session",
        "status": "complete",
        "payment_status": "paid",
        "amount_total": 100,
        "currency": "usd",
        "client_reference_id": "BK-NOSUCH",
    }
    client = fresh_paying_app.test_client()
    for bad_id in ("evt_\u0000nul", "evt_\u001fctl", "e" * 256):
        r = post_webhook(client, stripe_event("checkout.session.completed", session, event_id=bad_id))
        assert r.status_code == 400, bad_id
    assert [(r[0], r[1], r[2]) for r in _receipts(fresh_paying_app)] == [(None, "rejected", 400)] * 3
    assert not any(rec.exc_info for rec in caplog.records)
    with fresh_paying_app.app_context():
        assert db.session.query(ProcessedStripeEvent).count() == 0


@pytest.mark.parametrize("event_type", ["checkout.session.completed", "checkout.session.expired"])
def test_a_session_event_that_names_no_session_is_ignored_in_words_without_asking_the_provider(
    fresh_paying_app, sandbox, event_type, caplog
):
    """Found by the long fuzz run: a session id that is not a string reached the SDK (an
    'expired' notice is re-read from the provider) and raised TypeError, logged with a traceback
    as 'accepted, not applied'. Without a session there is nothing to apply or ask about."""
    before = sandbox.request_count()
    session = {
        "id": 12345,
        "object": "checkout.session",
        "status": "expired",
        "payment_status": "unpaid",
        "amount_total": 100,
        "currency": "usd",
        "metadata": {"order_id": "1"},
    }
    r = post_webhook(fresh_paying_app.test_client(), stripe_event(event_type, session, event_id="evt_no_session"))
    assert r.status_code == 200 and r.get_json()["outcome"] == "ignored"
    [receipt] = _receipts(fresh_paying_app)
    assert receipt[:3] == ("evt_no_session", "ignored", 200) and "names no checkout session" in receipt[3]
    assert sandbox.request_count() == before
    assert not any(rec.exc_info for rec in caplog.records)
