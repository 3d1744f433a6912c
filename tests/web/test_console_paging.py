"""A console list counts its rows only up to a cap past the page: an exact COUNT(*) of an
unfiltered list read every row at a million orders. Past the cap the total says "at least" and
the next page is still offered."""

from __future__ import annotations

from shop.console import queries
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import ReconciliationCycle
from support import log_in

JSON = {"Accept": "application/json"}


def small_pages(monkeypatch, cap: int):
    monkeypatch.setattr(queries, "COUNT_CAP", cap)
    real_paging = queries.paging
    monkeypatch.setattr(queries, "paging", lambda query, page, per_page=2: real_paging(query, page, 2))


def cycles(app, n: int) -> None:
    now = utcnow()
    with app.app_context():
        for _ in range(n):
            db.session.add(ReconciliationCycle(started_at=now, cutoff=now, status="skipped"))
        db.session.commit()


def test_a_long_list_counts_up_to_the_cap_past_the_page_and_still_pages_on(fresh_app, fresh_client, monkeypatch):
    cycles(fresh_app, 9)
    log_in(fresh_app, fresh_client)
    small_pages(monkeypatch, 3)

    first = fresh_client.get("/console/sweeps", headers=JSON).get_json()
    assert first["total"] == 5 and first["total_capped"] is True and first["next_page"] == 2
    html = fresh_client.get("/console/sweeps").get_data(as_text=True)
    assert "5+ in all" in html and "next page" in html
    last = fresh_client.get("/console/sweeps?page=5", headers=JSON).get_json()
    assert len(last["cycles"]) == 1 and last["next_page"] is None
    assert last["total"] == 9 and last["total_capped"] is False


def test_a_list_shorter_than_the_cap_has_its_exact_total(fresh_app, fresh_client, monkeypatch):
    cycles(fresh_app, 4)
    log_in(fresh_app, fresh_client)
    small_pages(monkeypatch, 3)
    page = fresh_client.get("/console/sweeps", headers=JSON).get_json()
    assert page["total"] == 4 and page["total_capped"] is False and page["next_page"] == 2
