"""The console's vocabulary (shop/console/words.py): every code an operator meets on a page has its
words, the audit says how an action went rather than its HTTP status, and the order page's money
summary counts the tax its payment charged; the console's JSON keeps the codes and its shape."""

from __future__ import annotations

from factories import force_order, placed_order_in
from shop.console import words
from shop.domain.events import EventName
from shop.domain.order import OrderStatus
from shop.domain.refunds import RefundStatus
from shop.extensions import db
from shop.models import CommandKind, Order, ReceiptOutcome, WorkStatus
from shop.money import format_money
from shop.saga import HANDLERS
from shop.web.words import STATUS_WORDS

JSON = {"Accept": "application/json"}


def test_every_state_event_handler_command_and_status_has_words_that_are_not_its_code():
    tables = [
        (STATUS_WORDS, list(OrderStatus)),
        (words.EVENT_WORDS, list(EventName)),
        (words.HANDLER_WORDS, list(HANDLERS)),
        (words.COMMAND_WORDS, list(CommandKind)),
        (words.WORK_WORDS, list(WorkStatus)),
        (words.REFUND_WORDS, list(RefundStatus)),
        (words.RECEIPT_WORDS, list(ReceiptOutcome)),
    ]
    for table, codes in tables:
        assert sorted(set(codes) - set(table)) == [], table
    assert [name for name in EventName if words.event_words(name) == name] == []
    assert [name for name in HANDLERS if words.handler_words(name) == name] == []
    assert [kind for kind in CommandKind if words.command_words(kind) == kind] == []
    assert words.work_words("something_new") == "something_new"  # an unknown code is shown as it is


def test_the_audit_says_how_an_action_went_not_its_http_status():
    assert [words.audit_outcome(s) for s in (200, 303, 409, 422, 500, 503)] == [
        words.AuditOutcome.DONE,
        words.AuditOutcome.DONE,
        words.AuditOutcome.REFUSED,
        words.AuditOutcome.REFUSED,
        words.AuditOutcome.FAILED,
        words.AuditOutcome.FAILED,
    ]


def test_a_refusal_code_is_said_in_the_customers_words():
    assert (
        words.refusal_words("expired_or_canceled_card") == "the card it would go back to has expired or was cancelled"
    )
    assert words.refusal_words("some_new_code") == "some new code"


def test_a_time_is_utc_text_in_a_time_element_for_the_browser_to_add_local_time_to():
    shown = str(words.when("2026-11-30T14:05:09Z"))
    assert shown == (
        '<time datetime="2026-11-30T14:05:09Z" data-local data-seconds data-beside>2026-11-30 14:05:09 UTC</time>'
    )
    assert str(words.when(None)) == "–"


def test_the_order_page_sums_up_the_money_with_its_tax_and_the_json_keeps_its_codes(fresh_app, fresh_client, token):
    oid, ref = placed_order_in(fresh_app)
    with fresh_app.app_context():
        before = fresh_client.get(f"/console/orders/{ref}", headers=JSON).get_json()
        total = db.session.get(Order, oid).total
        force_order(oid, status=OrderStatus.PAID, tax=150, charged=total + 150)
        currency = db.session.get(Order, oid).currency
        db.session.remove()
    after = fresh_client.get(f"/console/orders/{ref}", headers=JSON).get_json()
    assert set(after) == set(before) and set(after["order"]) == set(before["order"])
    assert "OrderPlaced" in [t["what"] for t in after["timeline"]]
    assert after["order"]["status"] == "Paid"
    page = fresh_client.get(f"/console/orders/{ref}").get_data(as_text=True)
    summary = page.split('id="money-summary"', 1)[1].split("</dl>", 1)[0]
    assert f"<dt>Paid</dt><dd>{format_money(total + 150, currency)}</dd>" in summary
    assert f"<dt>Tax</dt><dd>{format_money(150, currency)}</dd>" in summary
    assert f"<dt>Refunded</dt><dd>{format_money(0, currency)}</dd>" in summary
    assert "Order placed" in page and "OrderPlaced" not in page
