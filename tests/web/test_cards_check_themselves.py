"""The dashboard's cards check for themselves (docs/REFERENCE.md, Console): the provider card follows the provider
watch's own check (shop.provider.watch) with no customer traffic, the webhook card reddens only
for the provider's signed deliveries failing (noise from the internet is counted with its
address), a red card can be acknowledged until its condition changes or the time runs out, and
the dashboard opens with one line saying how many things need a human."""

from __future__ import annotations

import json
import logging

from sqlalchemy import select, update

from payment_helpers import HTML, JSON, Shopper, signature
from shop.extensions import db
from shop.models import CardAcknowledgement, OperatorAction, Order
from shop.provider import guard, probe, watch
from support import OPERATOR_EMAIL, log_in, wait_until


def card(client, key):
    return next(c for c in client.get("/console/", headers=JSON).get_json()["cards"] if c["key"] == key)


# -- the provider card -------------------------------------------------------------------------


def test_the_provider_card_flips_red_and_green_on_the_watchs_check_without_any_customer(make_shop, sandbox, fake_clock):
    # On a clock moved by hand: the card shows the check just made, 0 s ago however slow the
    # machine, and 7 s ago once the clock has moved on by 7.
    app = make_shop(sandbox=True, CLOCK=fake_clock)
    console = app.test_client()
    log_in(app, console)
    with app.app_context():
        assert watch.check_now() is True
    c = card(console, "provider")
    assert c["ok"] is True and c["checked_ago_seconds"] == 0 and "last checked 0 s ago" in c["words"], c
    fake_clock.advance(7)
    c = card(console, "provider")
    assert c["checked_ago_seconds"] == 7 and "last checked 7 s ago" in c["words"], c

    sandbox.faults(api_unavailable=True)
    with app.app_context():
        assert watch.check_now() is False
    c = card(console, "provider")
    assert c["ok"] is False and c["stale"] is False and c["words"].startswith("Unreachable")
    assert "503" in c["words"] and "Reachable:" not in c["words"]

    sandbox.faults(api_unavailable=False)
    with app.app_context():
        assert watch.check_now() is True
    assert card(console, "provider")["ok"] is True
    with app.app_context():
        assert db.session.execute(select(Order.id)).first() is None  # no customer was involved


def test_the_watch_thread_shows_an_outage_and_the_return_at_its_next_check(make_shop, sandbox, monkeypatch):
    """The watch as the scheduler runs it: nobody calls the provider but the watch, and the first
    check it starts after a change shows that change. With a check every CHECK_INTERVAL_SECONDS,
    each within PROBE_TIMEOUT_SECONDS, that is within 5 s (counted in checks here, not timed: a
    loaded machine makes the test's own polling late, not the watch's verdict)."""
    assert watch.CHECK_INTERVAL_SECONDS + probe.PROBE_TIMEOUT_SECONDS < 5
    checks: list[
        tuple[int, bool | None]
    ] = []  # (the change in force as the check started, its verdict; None: not asked)
    change = [0]
    check_now = watch.check_now

    def recorded_check():
        started_under = change[0]
        verdict = check_now()
        checks.append((started_under, verdict))
        return verdict

    monkeypatch.setattr(watch, "check_now", recorded_check)
    app = make_shop(sandbox=True)
    console = app.test_client()
    log_in(app, console)
    stop = watch.watch_in_background(app)
    try:

        def shown_by_the_next_check(ok: bool) -> None:
            wait_until(
                lambda: card(console, "provider")["ok"] is ok,
                timeout=30,
                what=f"the provider card to turn {'green' if ok else 'red'}",
                interval=0.1,
            )
            # The card may turn on a check that started just before the change (its call met the
            # change), or before the first check after the change is written down here: wait for it.
            [first] = wait_until(
                lambda: next(((v,) for under, v in list(checks) if under == change[0] and v is not None), None),
                timeout=30,
                what=f"a check started after change {change[0]} to give its verdict",
                interval=0.05,
            )
            assert first is ok, f"the first check after change {change[0]} said {first}: {checks}"

        shown_by_the_next_check(True)
        change[0] += 1
        sandbox.faults(api_unavailable=True)
        shown_by_the_next_check(False)
        change[0] += 1
        sandbox.faults(api_unavailable=False)
        shown_by_the_next_check(True)
    finally:
        stop.set()


def test_failed_checks_open_the_breaker_and_an_answered_one_closes_it(make_shop, sandbox):
    app = make_shop(sandbox=True, STRIPE_BREAKER_THRESHOLD=2, STRIPE_BREAKER_COOLDOWN_SECONDS=60)
    sandbox.faults(api_unavailable=True)
    with app.app_context():
        watch.check_now()
        assert guard.get().breaker_view()["state"] == guard.CLOSED  # one failure, below the threshold
        watch.check_now()
        assert guard.get().breaker_view()["state"] == guard.OPEN
        sandbox.faults(api_unavailable=False)
        assert watch.check_now() is True
        assert guard.get().breaker_view()["state"] == guard.CLOSED


def test_a_provider_card_never_checked_is_not_green(make_shop):
    app = make_shop()
    console = app.test_client()
    log_in(app, console)
    c = card(console, "provider")
    assert c["ok"] is False and c["stale"] is True and "never checked" in c["words"]
    assert "scheduler" in c["words"]


# -- the webhook card: noise and the provider's failures ----------------------------------------


def _event_body(event_id: str = "evt_noise") -> bytes:
    return json.dumps({"id": event_id, "type": "checkout.session.completed", "data": {"object": {}}}).encode()


def _post(app, body: bytes, headers: dict, address: str):
    return app.test_client().post(
        "/webhooks/stripe",
        data=body,
        headers={"Content-Type": "application/json", **headers},
        environ_base={"REMOTE_ADDR": address},
    )


def test_noise_does_not_redden_the_webhook_card_and_is_counted_with_its_address(fresh_paying_app, fresh_client, caplog):
    log_in(fresh_paying_app, fresh_client)
    with caplog.at_level(logging.WARNING):
        assert _post(fresh_paying_app, _event_body(), {}, "198.51.100.7").status_code == 400
        forged = {"Stripe-Signature": signature(_event_body(), "whsec_not_ours")}
        assert _post(fresh_paying_app, _event_body(), forged, "198.51.100.8").status_code == 400
        assert _post(fresh_paying_app, _event_body(), forged, "198.51.100.8").status_code == 400
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
    c = card(fresh_client, "rejected_webhooks")
    assert c["ok"] is True and c["count"] == 0
    assert c["noise"]["count"] == 3 and c["noise"]["latest_address"] == "198.51.100.8"
    assert c["noise"]["addresses"] == [
        {"address": "198.51.100.8", "count": 2},
        {"address": "198.51.100.7", "count": 1},
    ]
    assert "3 unsigned or badly signed requests (noise)" in c["words"] and "198.51.100.8" in c["words"]
    html = fresh_client.get("/console/", headers=HTML).get_data(as_text=True)
    assert "198.51.100.8 (2)" in html
    listed = fresh_client.get(c["noise"]["url"], headers=JSON).get_json()["webhooks"]
    assert {w["source_address"] for w in listed} == {"198.51.100.7", "198.51.100.8"}
    assert all(w["signed"] is False for w in listed)


def test_behind_the_front_the_noise_is_kept_with_the_clients_address(make_fresh_app, sandbox):
    from payment_helpers import WEBHOOK_SECRET

    app = make_fresh_app(BEHIND_FRONT=True, STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET)
    assert _post(app, _event_body(), {"X-Forwarded-For": "192.0.2.44"}, "127.0.0.1").status_code == 400
    console = app.test_client()
    log_in(app, console)
    assert card(console, "rejected_webhooks")["noise"]["latest_address"] == "192.0.2.44"


def test_a_signed_delivery_that_cannot_be_used_reddens_the_card_and_logs_critical(
    fresh_paying_app, fresh_client, caplog
):
    log_in(fresh_paying_app, fresh_client)
    with caplog.at_level(logging.WARNING):
        r = _post(fresh_paying_app, b"[1, 2]", {"Stripe-Signature": signature(b"[1, 2]")}, "203.0.113.5")
    assert r.status_code == 400
    assert any(rec.levelno == logging.CRITICAL for rec in caplog.records)
    c = card(fresh_client, "rejected_webhooks")
    assert c["ok"] is False and c["count"] == 1 and c["noise"]["count"] == 0
    assert c["words"].startswith("1 signed delivery from the provider failed")


# -- acknowledging a red card ------------------------------------------------------------------


def _signed_failure(app, address="203.0.113.5"):
    assert _post(app, b"[1, 2]", {"Stripe-Signature": signature(b"[1, 2]")}, address).status_code == 400


def test_an_acknowledged_card_stops_asking_for_a_human_until_a_new_failure_and_is_audited(
    fresh_paying_app, fresh_client
):
    token = log_in(fresh_paying_app, fresh_client)
    _signed_failure(fresh_paying_app)
    c = card(fresh_client, "rejected_webhooks")
    assert c["ok"] is False and c["acknowledged"] is None and c["needs_human"] is True
    url = "/console/cards/rejected_webhooks/acknowledge"

    r = fresh_client.post(url, data={"csrf_token": token, "reason": "", "hours": "4"}, headers=JSON)
    assert r.status_code == 400 and "Say why" in r.get_json()["error"]
    r = fresh_client.post(url, data={"csrf_token": token, "reason": "x", "hours": "999"}, headers=JSON)
    assert r.status_code == 400 and "1 to 168" in r.get_json()["error"]
    r = fresh_client.post(url, data={"csrf_token": token, "reason": "x", "condition": "stale"}, headers=JSON)
    assert r.status_code == 409 and "changed since you looked" in r.get_json()["error"]
    assert fresh_client.post(url, data={"reason": "no token", "hours": "4"}, headers=JSON).status_code == 400

    form = {"csrf_token": token, "reason": "secret rotated, deploying", "hours": "4", "condition": c["condition"]}
    r = fresh_client.post(url, data=form, headers=JSON)
    assert r.status_code == 200 and r.get_json()["outcome"] == "written"
    assert fresh_client.post(url, data=form, headers=JSON).get_json()["outcome"] == "already"  # idempotent
    data = fresh_client.get("/console/", headers=JSON).get_json()
    c = next(x for x in data["cards"] if x["key"] == "rejected_webhooks")
    assert c["ok"] is False and c["needs_human"] is False
    assert c["acknowledged"]["operator"] == OPERATOR_EMAIL
    assert c["acknowledged"]["reason"] == "secret rotated, deploying"
    assert "Webhooks" not in data["summary"]["words"].split(" acknowledged: ")[0]
    assert data["summary"]["acknowledged"] == 1
    with fresh_paying_app.app_context():
        assert db.session.query(CardAcknowledgement).count() == 1
        audited = (
            db.session.execute(
                select(OperatorAction).where(OperatorAction.action == "acknowledge_card", OperatorAction.status == 200)
            )
            .scalars()
            .all()
        )
        assert len(audited) == 2 and audited[0].reason == "secret rotated, deploying (for 4 h)"
        assert audited[0].operator == OPERATOR_EMAIL and audited[0].target == "card rejected_webhooks"

    _signed_failure(fresh_paying_app)  # a new failure after the acknowledgement: red again
    c = card(fresh_client, "rejected_webhooks")
    assert c["acknowledged"] is None and c["needs_human"] is True and c["count"] == 2


def test_an_acknowledgement_that_runs_out_leaves_the_card_red_again(fresh_paying_app, fresh_client):
    token = log_in(fresh_paying_app, fresh_client)
    _signed_failure(fresh_paying_app)
    r = fresh_client.post(
        "/console/cards/rejected_webhooks/acknowledge",
        data={"csrf_token": token, "reason": "looking into it", "hours": "1"},
        headers=JSON,
    )
    assert r.status_code == 200
    assert card(fresh_client, "rejected_webhooks")["needs_human"] is False
    with fresh_paying_app.app_context():
        from datetime import timedelta

        from shop.domain.deadlines import utcnow

        db.session.execute(update(CardAcknowledgement).values(until=utcnow() - timedelta(seconds=1)))
        db.session.commit()
    c = card(fresh_client, "rejected_webhooks")
    assert c["needs_human"] is True and c["acknowledged"] is None


def test_a_green_or_unknown_card_cannot_be_acknowledged(fresh_app, fresh_client, token):
    r = fresh_client.post(
        "/console/cards/rejected_webhooks/acknowledge", data={"csrf_token": token, "reason": "x"}, headers=JSON
    )
    assert r.status_code == 409 and "nothing to acknowledge" in r.get_json()["error"]
    r = fresh_client.post("/console/cards/nope/acknowledge", data={"csrf_token": token, "reason": "x"}, headers=JSON)
    assert r.status_code == 404 and "no dashboard card" in r.get_json()["error"]


def test_the_dashboard_opens_with_how_many_things_need_a_human_red_cards_first(fresh_paying_app, fresh_client):
    log_in(fresh_paying_app, fresh_client)
    _signed_failure(fresh_paying_app)
    data = fresh_client.get("/console/", headers=JSON).get_json()
    red = [c for c in data["cards"] if c["needs_human"]]
    assert data["summary"]["needs_human"] == len(red) >= 1
    assert data["cards"][: len(red)] == red  # red first
    assert data["summary"]["words"].startswith(f"{len(red)} thing")
    assert "Webhooks" in data["summary"]["words"]
    html = fresh_client.get("/console/", headers=HTML).get_data(as_text=True)
    first_line = html.index('id="needs-human"')
    assert first_line < html.index('data-card="') and data["summary"]["words"] in html


def test_a_flood_of_noise_is_counted_up_to_a_cap_and_says_so(fresh_paying_app, fresh_client, monkeypatch):
    from shop.console import board

    monkeypatch.setattr(board, "NOISE_COUNT_CAP", 2)
    log_in(fresh_paying_app, fresh_client)
    for n in range(3):
        assert _post(fresh_paying_app, _event_body(), {}, f"198.51.100.{n + 1}").status_code == 400
    c = card(fresh_client, "rejected_webhooks")
    assert c["ok"] is True and c["noise"]["count"] == 2 and c["noise"]["count_capped"] is True
    assert "2+ unsigned or badly signed requests (noise)" in c["words"]


def test_an_acknowledged_provider_outage_stays_acknowledged_through_probes_and_not_past_a_recovery(
    make_shop, sandbox, fake_clock
):
    app = make_shop(sandbox=True, STRIPE_BREAKER_THRESHOLD=1, STRIPE_BREAKER_COOLDOWN_SECONDS=60, CLOCK=fake_clock)
    console = app.test_client()
    token = log_in(app, console)
    sandbox.faults(api_unavailable=True)
    with app.app_context():
        assert watch.check_now() is False
        assert guard.get().breaker_view()["state"] == guard.OPEN
    r = console.post(
        "/console/cards/provider/acknowledge",
        data={"csrf_token": token, "reason": "provider incident, status page says 1 h", "hours": "2"},
        headers=JSON,
    )
    assert r.status_code == 200, r.get_data(as_text=True)
    with app.app_context():
        turn = guard.get().claim_probe()  # the prober's turn: half-open, the same outage
        if not turn.mine:
            fake_clock.advance(turn.wait + 0.05)
            assert guard.get().claim_probe().mine
        assert guard.get().breaker_view()["state"] == guard.HALF_OPEN
        assert watch.check_now() is False
    c = card(console, "provider")
    assert c["ok"] is False and c["acknowledged"] is not None and c["needs_human"] is False

    sandbox.faults(api_unavailable=False)
    with app.app_context():
        assert watch.check_now() is True
    assert card(console, "provider")["ok"] is True
    sandbox.faults(api_unavailable=True)  # a new outage: not the one acknowledged
    with app.app_context():
        assert watch.check_now() is False
    c = card(console, "provider")
    assert c["needs_human"] is True and c["acknowledged"] is None


# -- the provider's view of its deliveries: a wrong secret is not a scanner ----------------------


def test_a_wrong_signing_secret_reddens_the_card_through_the_providers_view_a_scanner_does_not(make_shop, sandbox):
    from shop.models import WebhookReceipt

    app = make_shop(served=True, STRIPE_WEBHOOK_SECRET="whsec_not_the_endpoints_secret")
    console = app.test_client()
    log_in(app, console)
    shopper_order = Shopper(app, app.skus).place()
    sandbox.set_outcome(shopper_order["payment"]["session_id"], "paid")

    def refused() -> int:  # the provider's delivery, refused for its signature
        with app.app_context():
            count = db.session.query(WebhookReceipt).filter_by(outcome="rejected").count()
            db.session.remove()
        return count

    wait_until(refused, timeout=10, what="the provider's delivery, refused for its signature", interval=0.1)
    c = card(console, "rejected_webhooks")
    assert c["ok"] is True and c["noise"]["count"] >= 1  # at the door, it looks like any scanner

    with app.app_context():
        view = watch.check_deliveries()
    assert view["count"] >= 1 and view["latest_type"] == "checkout.session.completed"
    c = card(console, "rejected_webhooks")
    assert c["ok"] is False and c["provider_undelivered"]["count"] >= 1
    assert "The provider reports" in c["words"] and "signing secret is wrong" in c["words"]
    assert "“Payment page completed”" in c["words"] and "checkout.session" not in c["words"]  # its type in words


def test_a_scanner_alone_leaves_the_providers_view_empty_and_the_card_green(fresh_paying_app, fresh_client):
    log_in(fresh_paying_app, fresh_client)
    assert _post(fresh_paying_app, _event_body(), {}, "198.51.100.50").status_code == 400
    with fresh_paying_app.app_context():
        assert watch.check_deliveries()["count"] == 0
    c = card(fresh_client, "rejected_webhooks")
    assert c["ok"] is True and c["provider_undelivered"]["count"] == 0 and c["noise"]["count"] == 1
