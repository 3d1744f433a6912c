"""The client's address behind the shop's own front (shop/web/proxies.py, ClientAddressFromFront;
docs/REFERENCE.md, `BACKSTOP_BEHIND_FRONT`): taken from X-Forwarded-For only for a request whose
peer is this machine (the front), and then only its last address (the one the front wrote); never
otherwise. Seen through the return page's per-address limit, 2 a minute here.
tests/processes/test_front.py shows the same through the real nginx."""

from __future__ import annotations

RETURN = "/checkout/return?order=NOPE&session_id=cs_test_nope"


def _status(client, peer: str, forwarded: str | None = None) -> int:
    headers = {"Accept": "application/json"}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    return client.get(RETURN, headers=headers, environ_base={"REMOTE_ADDR": peer}).status_code


def test_behind_the_front_each_forwarded_client_is_counted_on_its_own(make_fresh_app):
    client = make_fresh_app(BEHIND_FRONT=True, CHECKOUT_RETURN_PER_MINUTE=2).test_client()
    assert [_status(client, "127.0.0.1", "192.0.2.1") for _ in range(3)] == [404, 404, 429]
    assert _status(client, "127.0.0.1", "192.0.2.2") == 404
    # Only the last address counts: what a client put before the front's own is not believed.
    assert _status(client, "127.0.0.1", "192.0.2.3, 192.0.2.1") == 429
    assert _status(client, "::1", "192.0.2.1") == 429


def test_a_request_that_did_not_come_through_the_front_is_counted_by_its_peer(make_fresh_app):
    client = make_fresh_app(BEHIND_FRONT=True, CHECKOUT_RETURN_PER_MINUTE=2).test_client()
    answers = [_status(client, "198.51.100.5", f"192.0.2.{n}") for n in range(3)]
    assert answers == [404, 404, 429]


def test_without_the_front_the_header_is_never_believed(make_fresh_app):
    client = make_fresh_app(CHECKOUT_RETURN_PER_MINUTE=2).test_client()
    answers = [_status(client, "127.0.0.1", f"192.0.2.{n}") for n in range(3)]
    assert answers == [404, 404, 429]
