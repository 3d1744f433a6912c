"""How the shop writes an instant for the outside (domain.timestamps.iso, domain.deadlines.utcnow):
ISO 8601 in UTC with `Z` (docs/REFERENCE.md, Routes: "Times are ISO 8601 UTC with `Z`")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from shop.domain.deadlines import utcnow
from shop.domain.timestamps import iso


def test_iso_writes_a_utc_instant_with_z_and_its_microseconds():
    assert iso(datetime(2026, 12, 2, 14, 15, 6, 141000, tzinfo=timezone.utc)) == "2026-12-02T14:15:06.141000Z"


def test_iso_of_no_instant_is_none():
    assert iso(None) is None


def test_iso_keeps_any_other_offset_as_written():
    plus_two = timezone(timedelta(hours=2))
    assert iso(datetime(2026, 12, 2, 14, 0, tzinfo=plus_two)) == "2026-12-02T14:00:00+02:00"


def test_utcnow_is_an_aware_instant_in_utc():
    before = datetime.now(timezone.utc)
    now = utcnow()
    assert now.utcoffset() == timedelta(0)
    assert before <= now <= datetime.now(timezone.utc)
