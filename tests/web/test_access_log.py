"""The demo web's access log keeps a URL's query after its "?" and never writes an order's
private access token (shop/devserver/access_log.py; the whole `flask shop up` run is checked in
tests/processes/test_devserver.py)."""

from __future__ import annotations

import pytest

from shop.devserver.access_log import logged_query


@pytest.mark.parametrize(
    ("query", "logged"),
    [
        ("", ""),
        ("page=2", "?page=2"),
        ("token=s3cr3t", "?token=[hidden]"),
        ("token=s3cr3t&page=2", "?token=[hidden]&page=2"),
        ("session_id=cs_test_1", "?session_id=cs_test_1"),
        ("q=a%20b&token=", "?q=a+b&token=[hidden]"),
        ("token", "?[hidden]"),  # not a name=value pair: hidden whole, since it names the field
    ],
)
def test_the_access_log_keeps_the_query_and_hides_the_access_token(query, logged):
    assert logged_query(query) == logged
    assert "s3cr3t" not in logged_query(query)
