"""A console list asked for a filter value it does not have (docs/REFERENCE.md, Console) answers
400 in words naming the values there are, as JSON or as a page whose way back is the list."""

from __future__ import annotations

import pytest

from shop.console import outbox_queries, queries
from shop.domain.order import OrderStatus
from support import log_in

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}

LISTS = [
    ("/console/orders?status=bogus", "order status", sorted(OrderStatus)),
    ("/console/outbox?status=bogus", "status", outbox_queries.WORK_FILTERS),
    ("/console/restore-warnings?state=bogus", "state", queries.WARNING_STATES),
    ("/console/webhooks?outcome=bogus", "outcome", queries.WEBHOOK_OUTCOMES),
    ("/console/refunds?status=bogus", "status", queries.REFUND_FILTERS),
]


@pytest.mark.parametrize(("url", "what", "choices"), LISTS)
def test_an_unknown_filter_value_is_a_400_naming_the_values_with_a_way_back_to_the_list(
    fresh_app, fresh_client, url, what, choices
):
    log_in(fresh_app, fresh_client)
    answer = fresh_client.get(url, headers=JSON)
    assert (answer.status_code, answer.get_json()) == (
        400,
        {"error": f"Unknown {what} 'bogus'; use one of {', '.join(choices)}.", "status": 400},
    )
    page = fresh_client.get(url, headers=HTML)
    assert page.status_code == 400
    assert f'href="{url.split("?")[0]}"' in page.get_data(as_text=True)
