"""The retention rules' cutoffs (shop.domain.retention), without a database: each kind's cutoff
from `now` and the two settings, and the floors no setting goes below."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from shop.domain.retention import cutoffs

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


def test_by_default_work_receipts_and_cycles_go_after_thirty_days_and_audit_after_four_hundred():
    c = cutoffs(NOW, 30, 400)
    assert c.work == c.receipts == c.cycles == c.provider_events == NOW - 30 * DAY
    assert c.audit == NOW - 400 * DAY


def test_a_short_retention_never_takes_a_receipt_younger_than_seven_days_nor_a_dedup_row_younger_than_thirty():
    c = cutoffs(NOW, 1, 400)
    assert c.work == c.cycles == NOW - DAY
    assert c.receipts == NOW - 7 * DAY  # Stripe retries a webhook for up to 3 days
    assert c.provider_events == NOW - 30 * DAY  # the provider lists 30 days of events


def test_a_long_retention_holds_receipts_and_dedup_rows_as_long_as_the_work():
    c = cutoffs(NOW, 90, 30)
    assert c.receipts == c.provider_events == c.work == NOW - 90 * DAY
    assert c.audit == NOW - 30 * DAY  # the audit has its own setting, shorter or longer


def test_the_first_answers_of_idempotent_requests_are_kept_one_day_whatever_the_settings_say():
    for retention, audit in ((1, 1), (30, 400), (90, 30)):
        assert cutoffs(NOW, retention, audit).answers == NOW - DAY
