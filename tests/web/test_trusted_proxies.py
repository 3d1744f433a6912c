"""The client's address behind a balancer (docs/REFERENCE.md, Settings: `TRUSTED_PROXIES`;
shop/web/proxies.py). Behind a balancer every request connects from the balancer's address: with
nothing trusted, one client's requests spent every client's per-address limits (the return page,
the console's login). With the balancer trusted, each client is counted by the address the
balancer names; a client that forges X-Forwarded-For itself, or sends it from a peer nobody
trusts, is counted by its own address. Real app, Redis and database; the peer is the test
client's REMOTE_ADDR."""

from __future__ import annotations

import logging
import subprocess

import pytest
from werkzeug.middleware.proxy_fix import ProxyFix

from process_support import ROOT, flask_command, process_env
from shop.models import WebhookReceipt
from shop.settings import load_settings
from shop.settings_values import SettingsError, parse_trusted_proxies
from shop.web.proxies import client_address
from support import OPERATOR_EMAIL, OPERATOR_PASSWORD, add_operator, csrf_token, rows_in

RETURN = "/checkout/return?order=NOPE&session_id=cs_test_nope"
BALANCER = "10.0.0.5"


def login(client, password: str = OPERATOR_PASSWORD, email: str = OPERATOR_EMAIL):
    data = {"csrf_token": csrf_token(client, "/console/login"), "email": email, "password": password}
    return client.post("/console/login", data=data, headers={"Accept": "application/json"})


def _return(client, peer: str, forwarded: str | None = None) -> int:
    headers = {"Accept": "application/json"}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    return client.get(RETURN, headers=headers, environ_base={"REMOTE_ADDR": peer}).status_code


def test_behind_a_trusted_balancer_one_clients_return_pages_never_throttle_another(make_fresh_app):
    app = make_fresh_app(TRUSTED_PROXIES=parse_trusted_proxies("10.0.0.0/8"), CHECKOUT_RETURN_PER_MINUTE=3)
    client = app.test_client()
    assert [_return(client, BALANCER, "198.51.100.1") for _ in range(4)] == [404, 404, 404, 429]
    # Another customer through the same balancer still has all of theirs.
    assert [_return(client, BALANCER, "198.51.100.2") for _ in range(3)] == [404, 404, 404]


def test_without_trusted_proxies_a_balancers_clients_share_its_address(make_fresh_app):
    # The finding, as it was and still is by default: the header is not believed from anyone.
    client = make_fresh_app(CHECKOUT_RETURN_PER_MINUTE=3).test_client()
    answers = [_return(client, BALANCER, f"198.51.100.{n}") for n in range(4)]
    assert answers == [404, 404, 404, 429]


def test_a_forged_header_is_not_believed_from_an_untrusted_peer_nor_before_the_balancers_own_entry(
    make_fresh_app,
):
    app = make_fresh_app(TRUSTED_PROXIES=parse_trusted_proxies("10.0.0.0/8"), CHECKOUT_RETURN_PER_MINUTE=2)
    client = app.test_client()
    # Straight from the internet, claiming a new address each time: counted as its own address.
    assert [_return(client, "203.0.113.9", f"198.51.100.{n}") for n in range(3)] == [404, 404, 429]
    # Through the balancer, claiming to be someone else: the balancer appended the real address.
    forged = [_return(client, BALANCER, f"198.51.100.{n}, 203.0.113.7") for n in range(3)]
    assert forged == [404, 404, 429]
    assert _return(client, BALANCER, "198.51.100.1") == 404  # the one it claimed was never charged


def test_a_trusted_hop_count_takes_the_address_the_router_appended(make_fresh_app):
    client = make_fresh_app(TRUSTED_PROXIES=parse_trusted_proxies("1"), CHECKOUT_RETURN_PER_MINUTE=2).test_client()
    assert [_return(client, "10.1.2.3", f"198.51.100.{n}, 203.0.113.7") for n in range(3)] == [404, 404, 429]
    assert _return(client, "10.1.2.3", "198.51.100.1") == 404  # another client through the same router


def test_behind_a_balancer_failed_logins_from_one_client_leave_the_console_open_to_another(make_fresh_app, caplog):
    app = make_fresh_app(
        TRUSTED_PROXIES=parse_trusted_proxies("10.0.0.0/8"),
        LOGIN_MAX_FAILURES_PER_ACCOUNT=100,
        LOGIN_MAX_FAILURES_PER_ADDRESS=3,
    )
    add_operator(app)

    def through_balancer(client_addr: str):
        client = app.test_client()
        client.environ_base.update(REMOTE_ADDR=BALANCER, HTTP_X_FORWARDED_FOR=client_addr)
        return client

    with caplog.at_level(logging.INFO):
        guesses = [login(through_balancer("203.0.113.9"), "wrong", email=f"guess{n}@example.com") for n in range(4)]
        operator = login(through_balancer("198.51.100.4"))
    assert [r.status_code for r in guesses] == [401, 401, 401, 429]
    assert operator.status_code == 200
    # The log names the clients, never the balancer.
    assert "console login refused for 'guess0@example.com' from 203.0.113.9" in caplog.text
    assert "logged in from 198.51.100.4" in caplog.text and f"from {BALANCER}" not in caplog.text


def test_the_webhooks_receipt_records_the_client_the_balancer_named(make_fresh_app):
    app = make_fresh_app(TRUSTED_PROXIES=parse_trusted_proxies("10.0.0.0/8"))
    answer = app.test_client().post(
        "/webhooks/stripe",
        data=b"{}",
        headers={"Content-Type": "application/json", "X-Forwarded-For": "198.51.100.77"},
        environ_base={"REMOTE_ADDR": BALANCER},
    )
    assert answer.status_code == 400
    assert [r.source_address for r in rows_in(app, WebhookReceipt)] == ["198.51.100.77"]


CHAINS = ["", "a", "a, b", "a,b,c", " a , b ,c,d ", "a,,b", ",", "a, b, c, d, e, f"]


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_a_hop_count_follows_werkzeugs_proxy_fix_rule_exactly(hops):
    fixed = {}

    def app(environ, start_response):
        fixed["addr"] = environ["REMOTE_ADDR"]
        return []

    for chain in CHAINS:
        environ = {"REMOTE_ADDR": "peer", "HTTP_X_FORWARDED_FOR": chain}
        ProxyFix(app, x_for=hops, x_proto=0, x_host=0)(environ, lambda *a: None)
        assert client_address("peer", chain, parse_trusted_proxies(str(hops))) == fixed["addr"], chain


def test_networks_walk_back_only_through_trusted_peers():
    trust = parse_trusted_proxies("10.0.0.0/8, 2001:db8::/32")
    assert client_address("10.0.0.1", "1.1.1.1, 2.2.2.2, 10.0.0.9", trust) == "2.2.2.2"
    assert client_address("::ffff:10.0.0.1", "2.2.2.2", trust) == "2.2.2.2"
    assert client_address("2001:db8::1", "10.0.0.2, 10.0.0.3", trust) == "10.0.0.2"
    assert client_address("192.0.2.1", "2.2.2.2", trust) == "192.0.2.1"
    assert client_address("10.0.0.1", "2.2.2.2, ,", trust) == "2.2.2.2"  # empty entries are none
    assert client_address("10.0.0.1", None, trust) == "10.0.0.1"


BAD = [
    ("banana", "must be a hop count (1) or networks separated by commas (10.0.0.0/8,192.0.2.7), got 'banana'"),
    ("9", "a hop count must be between 0 and 5, got 9"),
    ("1, 10.0.0.0/8", "give a hop count or networks, not both"),
    ("10.0.0.1/8", "10.0.0.1/8 has bits set past its prefix: did you mean 10.0.0.0/8?"),
    ("10.0.0.0/8,", "got ''"),
    ("10.0.0.0/33", "got '10.0.0.0/33'"),
]


@pytest.mark.parametrize("value,problem", BAD, ids=[v for v, _ in BAD])
def test_a_malformed_trusted_proxies_is_refused_in_words(value, problem, tmp_path):
    with pytest.raises(SettingsError) as caught:
        load_settings({"TRUSTED_PROXIES": value}, str(tmp_path), argv=["flask", "shop", "worker"])
    assert str(caught.value).startswith("TRUSTED_PROXIES: ") and problem in str(caught.value)


def test_the_preflight_fails_a_malformed_trusted_proxies_naming_it(make_fresh_app):
    env = process_env(make_fresh_app(), TRUSTED_PROXIES="10.0.0.0/33")
    command = [*flask_command(), "--app", "app", "shop", "check"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "settings" in run.stdout and "TRUSTED_PROXIES: must be a hop count" in run.stdout, run.stdout
