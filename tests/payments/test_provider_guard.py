"""The provider guard in one process (provider.guard, applied in guarded.guarded_call): the breaker
shared through Redis, the time budget of a customer's request, the priority of customer calls in
the rate budget, and a 429 storm. Real database, Redis and sandbox (its request log says which
calls reached the provider). The process-and-thread behaviour (bulkhead, budget across
processes) is in test_provider_processes.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import urllib3

from payment_helpers import JSON, ProviderTransportLog, Shopper
from shop import clock as shop_clock
from shop.clock import SystemClock
from shop.console.words import BREAKER_WORDS
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order
from shop.payments import checkout_queue
from shop.provider import gateway, guard, watch
from shop.scheduling.sweep import run_cycle
from support import FakeClock, log_in, wait_until

STALE = "PendingPayment"


def _pay_later_page(shopper: Shopper, response) -> dict:
    """The customer was sent to the order page, which holds the order and offers "Pay now"."""
    assert response.status_code == 303, response.get_data(as_text=True)
    location = response.headers["Location"]
    assert "/orders/" in location, location
    page = shopper.client.get(location, headers={"Accept": "text/html"}).get_data(as_text=True)
    assert "its items are held for you until" in page and "Pay now" in page, page
    return shopper.latest()


def test_with_30s_of_provider_latency_checkout_answers_within_the_request_budget_with_the_order_placed(
    make_shop, sandbox, monkeypatch
):
    # Background calls keep the production defaults (10 s x 3 attempts): only the customer's own
    # timeouts, one retry and the request's budget keep the answer within that budget
    # (docs/REFERENCE.md, Guarantees: 2 s to connect, 4 s to answer, one retry, 9 s in all).
    app = make_shop(
        sandbox=True, STRIPE_TIMEOUT_SECONDS=10, STRIPE_MAX_NETWORK_RETRIES=2, STRIPE_REQUEST_BUDGET_SECONDS=9.0
    )
    shopper = Shopper(app)
    transport = ProviderTransportLog(monkeypatch)
    sandbox.faults(api_latency_seconds=30)
    try:
        response = shopper.checkout()
    finally:
        sandbox.faults(api_latency_seconds=0)
    order = _pay_later_page(shopper, response)
    assert order["status"] == STALE and order["pay_by"]
    # What the customer waited on: the attempts the provider never answered, each cut by the
    # customer's timeouts and by what was left of the request's deadline.
    cfg = app.config
    attempts = [(t.connect, t.read) for t in transport.timeouts]
    assert 1 <= len(attempts) <= 1 + cfg["STRIPE_REQUEST_MAX_NETWORK_RETRIES"], transport.timeouts
    assert all(
        connect <= cfg["STRIPE_REQUEST_CONNECT_TIMEOUT_SECONDS"] and read <= cfg["STRIPE_REQUEST_READ_TIMEOUT_SECONDS"]
        for connect, read in attempts
    ), (attempts, "the background timeouts, not the customer's")
    assert len({t.deadline for t in transport.timeouts}) == 1, "one request, one deadline"
    transport.assert_within_deadline()


def _breaker(app) -> dict:
    with app.app_context():
        return guard.get().breaker_view()


def test_after_the_threshold_the_breaker_opens_for_every_process_and_a_probe_closes_it_soon_after_the_return(
    make_shop, sandbox, fake_clock, monkeypatch
):
    app = make_shop(sandbox=True, STRIPE_BREAKER_THRESHOLD=3, CLOCK=fake_clock)
    other_process = make_shop(sandbox=True, STRIPE_BREAKER_THRESHOLD=3, CLOCK=fake_clock)
    sandbox.faults(api_unavailable=True)
    for _ in range(3):
        _pay_later_page(shopper := Shopper(app), shopper.checkout())
    assert _breaker(app)["state"] == guard.OPEN

    sessions = lambda: sandbox.request_count(method="POST")  # noqa: E731 - checkouts' session creates
    probes = lambda: sandbox.request_count(method="GET")  # noqa: E731 - the probers' reads
    created = sessions()
    transport = ProviderTransportLog(monkeypatch)
    for instance in (app, other_process):  # the other app has its own guard: the state is in Redis
        shopper = Shopper(instance)
        response = shopper.checkout()
        assert _pay_later_page(shopper, response)["status"] == STALE
        # Answered at once: the open breaker refused the call before any request was made, so
        # nothing waited on the provider that does not answer.
        assert transport.timeouts == [] and sessions() == created, (transport.timeouts, sessions(), created)
    # While the provider stays down, both processes' probers share one probe per spacing of the
    # clock: each time it moves on by one (and a millisecond, past the float's rounding), one
    # more probe, and none can be claimed until it moves. The clock moves again only once the
    # probe's failure is recorded (the breaker open again, not half-open): the next spacing is
    # counted from that record, so a record made after the move would wait for a move that never came.
    for probe in range(1, 4):
        with app.app_context():
            assert not guard.get().claim_probe().mine, "a probe could be claimed before its spacing had passed"
        fake_clock.advance(guard.PROBE_SPACING_SECONDS + 0.001)
        wait_until(
            lambda probe=probe: probes() >= probe and _breaker(app)["state"] == guard.OPEN,
            10,
            f"probe {probe} of the two processes' probers, its failure recorded",
        )
        assert probes() == probe
    assert sessions() == created, "a customer's checkout called the provider while the breaker was open"
    assert {c["path"] for c in sandbox.requests(method="GET")} == {"/v1/events"}
    assert _breaker(app)["state"] in (guard.OPEN, guard.HALF_OPEN)

    sandbox.faults(api_unavailable=False)
    fake_clock.advance(guard.PROBE_SPACING_SECONDS + 0.001)  # the next probe is due: it finds the provider back
    wait_until(lambda: _breaker(app)["state"] == guard.CLOSED, 10, "the probe after the provider's return to close it")
    assert sessions() == created, "a customer's call was the probe"
    shopper = Shopper(other_process)
    response = shopper.checkout()
    assert response.status_code == 303 and "/pay/" in response.headers["Location"]
    view = _breaker(app)
    assert view["state"] == guard.CLOSED and view["shared"] and view["last_probe_at"]
    assert view["transitions"][guard.OPEN] == view["transitions"][guard.HALF_OPEN] >= 3
    assert view["transitions"][guard.CLOSED] == 1

    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert 'shop_provider_breaker_state{state="closed"} 1.0' in metrics
    assert 'shop_provider_breaker_transitions_total{to="closed"} 1.0' in metrics


def test_probes_that_keep_failing_back_off_to_the_cool_down(make_fresh_app):
    """About ten seconds at one probe a second (a blip ends within a second of the provider's
    return), then doubling gaps up to the cool-down while the outage lasts. The local view runs
    the same rule as the shared scripts, on a clock the test moves."""
    limits = guard.limits_from(
        {**make_fresh_app().config, "STRIPE_BREAKER_COOLDOWN_SECONDS": 30, "STRIPE_BREAKER_THRESHOLD": 1}
    )
    local, gaps, last = guard._LocalState(), [], None
    local.record(1000.0, False, limits)
    for hundredth in range(30000):
        now = 1000 + hundredth / 100
        if local.claim_probe(now, limits).mine:
            if last is not None:
                gaps.append(round(now - last, 1))
            last = now
            local.probe_result(now + 0.05, False, limits)
    step = guard.PROBE_SPACING_SECONDS
    assert gaps[:10] == [step] * 10
    assert gaps[10:15] == [round(step * 2**n, 1) for n in range(1, 5)] + [30.0]
    assert set(gaps[15:]) == {30.0}


def test_the_console_dashboard_says_the_providers_state_in_words(make_shop, sandbox):
    app = make_shop(sandbox=True, STRIPE_BREAKER_THRESHOLD=1, STRIPE_BREAKER_COOLDOWN_SECONDS=60)
    console = app.test_client()
    log_in(app, console)
    assert console.get("/console/", headers=JSON).get_json()["provider"]["state"] == guard.CLOSED
    sandbox.faults(api_unavailable=True)
    Shopper(app).checkout()
    provider = console.get("/console/", headers=JSON).get_json()["provider"]
    assert provider["state"] == guard.OPEN and provider["words"] == BREAKER_WORDS[guard.OPEN]
    page = console.get("/console/", headers={"Accept": "text/html"}).get_data(as_text=True)
    assert "Unavailable: checkout takes orders and holds their stock" in page


def test_the_provider_card_is_not_green_while_the_latest_calls_failed_below_the_breakers_threshold(make_shop, sandbox):
    """A breaker still closed after failed calls is no evidence the provider is reachable."""
    app = make_shop(sandbox=True, STRIPE_BREAKER_THRESHOLD=50)
    console = app.test_client()
    log_in(app, console)
    card = lambda: next(
        c
        for c in console.get("/console/", headers=JSON).get_json()["cards"]  # noqa: E731
        if c["key"] == "provider"
    )
    with app.app_context():
        assert watch.check_now() is True  # the watch's check: without one the card is not green
    assert card()["ok"] is True and card()["words"].startswith(BREAKER_WORDS[guard.CLOSED])
    sandbox.faults(api_unavailable=True)
    Shopper(app).checkout()
    provider = console.get("/console/", headers=JSON).get_json()["provider"]
    assert provider["state"] == guard.CLOSED and provider["failures"] >= 1
    c = card()
    assert c["ok"] is False and c["count"] == 1 and c["words"].startswith("Failing: the last")
    assert "Reachable" not in c["words"]
    sandbox.faults(api_unavailable=False)
    Shopper(app).checkout()  # one call that answers resets the count
    assert card()["ok"] is True


def test_a_process_that_cannot_reach_redis_keeps_its_own_breaker(make_fresh_app, sandbox):
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url, STRIPE_BREAKER_THRESHOLD=2, STRIPE_BREAKER_COOLDOWN_SECONDS=60
    )
    sandbox.faults(api_unavailable=True)
    with app.app_context():
        provider_guard = guard.get()
        provider_guard._redis_url = "redis://127.0.0.1:1/0"  # nothing listens there
        for _ in range(2):
            with pytest.raises(gateway.ProviderUnavailable):
                gateway.retrieve_session("cs_test_nothing")
        calls = sandbox.request_count()
        with pytest.raises(gateway.ProviderUnavailable, match="circuit breaker open"):
            gateway.retrieve_session("cs_test_nothing")
        assert sandbox.request_count() == calls
        view = provider_guard.breaker_view()
        # This process's own breaker, and no check by the provider watch (none ran here).
        assert {k: view[k] for k in provider_guard.local.view()} == provider_guard.local.view()
        assert view["shared"] is False and view["checked_at"] is None


def test_background_calls_leave_the_last_of_the_rate_budget_to_customers(make_fresh_app, sandbox, fake_clock):
    # 20/s: a burst of 2 tokens, of which background callers may not take the last one. The bucket
    # reads a clock that stands still: on Redis's own, a token comes back every 71 ms.
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_RATE_LIMIT_PER_SECOND=20,
        STRIPE_BACKGROUND_WAIT_SECONDS=0.0,
        STRIPE_CUSTOMER_WAIT_SECONDS=0.0,
        CLOCK=fake_clock,
    )
    with app.app_context():
        provider_guard = guard.get()
        with guard.customer_call():
            provider_guard.take_token()  # the burst is 2 tokens: one left, at the reserve
        with pytest.raises(guard.Shed, match="for background work"):
            provider_guard.take_token()  # the sweep or a refund: backs off
        with guard.customer_call():
            provider_guard.take_token()  # a checkout still gets the last one


def test_each_of_the_sdks_own_retries_takes_a_token_of_the_rate_budget(make_fresh_app, sandbox, fake_clock):
    # 2/s: a burst of 1 token. The buckets read a clock that stands still, so no token comes back
    # whenever the SDK's retry goes (about 0.4 s later, or seconds on a loaded machine): it must
    # not go out (with the SDK's retries outside the budget, the provider would have seen 3).
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_RATE_LIMIT_PER_SECOND=2,
        STRIPE_MAX_NETWORK_RETRIES=2,
        STRIPE_BACKGROUND_WAIT_SECONDS=0.0,
        CLOCK=fake_clock,
    )
    sandbox.faults(api_unavailable=True)
    with app.app_context():
        with pytest.raises(gateway.ProviderUnavailable, match="rate budget"):
            gateway.retrieve_session("cs_test_nothing")
    assert sandbox.request_count() == 1


class _MinuteAhead(SystemClock):
    """The system's clocks on a host whose time of day is a minute ahead."""

    def now(self):
        return super().now() + timedelta(seconds=60)

    def time(self) -> float:
        return super().time() + 60


class _HalfTheReadsLate(FakeClock):
    """A clock moved by hand whose every other reading of the time of day comes 50 ms late (a
    thread that read it, then waited for the GIL); Redis keeps the true time (`shared_time`)."""

    reads = 0

    def time(self) -> float:
        self.reads += 1
        return super().time() - (0.05 if self.reads % 2 else 0.0)

    def shared_time(self) -> float | None:
        return super().time()


def test_a_process_whose_clock_runs_ahead_cannot_probe_before_the_shared_breakers_next_probe(make_fresh_app):
    # The breaker keeps Redis's clock: a host whose clock is a minute ahead (or a thread whose
    # reading came late) would otherwise see every gap between probes as over and probe at once.
    app = make_fresh_app(STRIPE_BREAKER_THRESHOLD=2, STRIPE_BREAKER_COOLDOWN_SECONDS=30)
    with app.app_context():
        provider_guard = guard.get()
        provider_guard.record(False)
        provider_guard.record(False)
        assert provider_guard.breaker_view()["state"] == guard.OPEN
        shop_clock.use(_MinuteAhead())  # this process's clock from here on
        with pytest.raises(guard.Shed, match="circuit breaker open"):
            provider_guard.admit()
        turn = provider_guard.claim_probe()
        assert not turn.mine and 0 < turn.wait <= guard.PROBE_SPACING_SECONDS
        assert provider_guard.breaker_view()["state"] == guard.OPEN


@pytest.mark.parametrize("redis", ["shared", "unreachable"])
def test_callers_whose_clocks_read_late_share_one_budget_and_get_no_extra_refill(make_fresh_app, redis):
    # In a busy process a thread reads the clock, then waits for the GIL before its request
    # reaches Redis; another process's clock may be behind. Half the callers here read 50 ms
    # late. The bucket keeps its own time: with a clock per caller, each late caller rewound it
    # and the next one was refilled for the same 50 ms again.
    budget = 20
    late = _HalfTheReadsLate()
    app = make_fresh_app(STRIPE_RATE_LIMIT_PER_SECOND=budget, STRIPE_CUSTOMER_WAIT_SECONDS=0.0, CLOCK=late)
    with app.app_context():
        provider_guard, limits = guard.get(), guard.get().limits
        if redis == "unreachable":  # this process's own view: its share of the budget
            provider_guard._redis_url = "redis://127.0.0.1:1/0"  # nothing listens there
            provider_guard._run("take", guard._BUCKET_TAKE, [provider_guard.bucket_key], [1, 1, 0])
        granted, started = 0, late.monotonic()
        with guard.customer_call():
            while late.monotonic() - started < 1.0:
                try:
                    provider_guard.take_token()
                    granted += 1
                except guard.Shed:
                    pass
                late.advance(0.002)
        elapsed = late.monotonic() - started
    share = 1 if redis == "shared" else limits.processes
    most = max(1.0, limits.bucket_capacity / share) + limits.refill_per_second / share * elapsed
    assert granted <= most + 1, f"{granted} tokens granted in {elapsed:.2f} s; the bucket holds {most:.1f}"
    assert granted >= most - 2, f"only {granted} tokens granted in {elapsed:.2f} s; the bucket holds {most:.1f}"


def test_a_429_storm_puts_checkouts_in_line_the_queue_and_the_sweep_wait_out_retry_after_until_every_order_is_paid(
    make_shop, sandbox
):
    # Budgets too short to wait out a 429's Retry-After in the request (test_provider_rate_limit_retry.py)
    app = make_shop(sandbox=True, STRIPE_BREAKER_COOLDOWN_SECONDS=1.0, STRIPE_REQUEST_BUDGET_SECONDS=1.2)
    sandbox.faults(api_rate_limit_per_second=1)
    shoppers = [Shopper(app) for _ in range(5)]
    answers = [s.checkout() for s in shoppers]
    assert all(a.status_code == 303 for a in answers)
    later = [s for s, a in zip(shoppers, answers, strict=True) if "/pay/" not in a.headers["Location"]]
    assert later, "the provider limited us, so some checkouts were put in line"
    for shopper in later:
        waiting = shopper.latest()
        assert waiting["status"] == STALE and waiting["payment"]["status"] == "queued", waiting
    calls = sandbox.requests()
    assert [c["status"] for c in calls].count(429) == 1, (
        f"after one 429 nobody called the provider again before its Retry-After: {calls}"
    )

    # Nobody presses "Pay now": the payment queue gives each its session as the provider allows.
    with app.app_context():
        checkout_queue.serve_now()
    orders = [s.latest() for s in shoppers]
    assert {o["status"] for o in orders} == {"PaymentInitiated"}
    for order in orders:
        sandbox.set_outcome(order["payment"]["session_id"], "paid")  # no webhook endpoint: only the sweep learns

    since = time.time()
    with app.app_context():
        for _ in range(10):
            run_cycle(now=utcnow() + timedelta(seconds=app.config["RECONCILIATION_STUCK_AGE_SECONDS"] + 60))
            db.session.expire_all()
            if {o.status for o in db.session.query(Order)} == {"Paid"}:
                break
        else:
            raise AssertionError("the sweep never brought every order to Paid")
        db.session.remove()
    calls = sandbox.requests(since=since)
    for limited in (c for c in calls if c["status"] == 429):
        too_soon = [c for c in calls if limited["at"] < c["at"] < limited["at"] + 0.95]
        assert not too_soon, f"a call went out before the 429's Retry-After: {too_soon}"


def test_a_process_that_cannot_reach_redis_spends_only_its_share_of_the_rate_budget(make_fresh_app, fake_clock):
    # Its own view refills on the shop's clock, which stands still here.
    app = make_fresh_app(
        STRIPE_RATE_LIMIT_PER_SECOND=20, WEB_CONCURRENCY=2, STRIPE_CUSTOMER_WAIT_SECONDS=0.0, CLOCK=fake_clock
    )
    with app.app_context():
        provider_guard = guard.get()
        provider_guard._redis_url = "redis://127.0.0.1:1/0"  # nothing listens there
        with guard.customer_call():
            provider_guard.take_token()  # half of the burst of 2: the other process may spend the rest
            with pytest.raises(guard.Shed, match="rate budget"):
                provider_guard.take_token()


def test_past_the_bulkhead_only_an_eighth_of_the_threads_wait_for_a_slot_and_the_rest_are_refused_at_once():
    # 16 threads, 1 slot: 2 may wait. In a brownout no slot frees for seconds, and every
    # waiting checkout is a thread the catalog cannot have.
    limits = guard.Limits(
        max_concurrent=1,
        rate_per_second=80,
        breaker_threshold=5,
        breaker_cooldown_seconds=30,
        customer_wait_seconds=60,
        background_wait_seconds=60,
        probe_seconds=15,
        threads=16,
    )
    assert limits.max_waiting == 2
    provider_guard = guard.ProviderGuard(limits, None, "test")
    outcomes: list[str] = []
    lock = threading.Lock()

    def ask():
        try:
            with provider_guard.slot():
                outcome = "served"
        except guard.Shed as shed:
            assert "already in flight" in str(shed)
            outcome = "refused"
        with lock:
            outcomes.append(outcome)

    askers = [threading.Thread(target=ask) for _ in range(5)]
    with provider_guard.slot():
        for t in askers:
            t.start()
        # While the one slot stays taken: three are refused without waiting for it, two wait.
        wait_until(lambda: len(outcomes) == 3, 10, "three askers to be refused while the slot is held")
        assert outcomes == ["refused"] * 3
    for t in askers:
        t.join(timeout=10)
    assert sorted(outcomes) == ["refused"] * 3 + ["served"] * 2, outcomes


def test_a_grant_grown_stale_before_its_request_is_written_is_given_back_and_a_fresh_one_taken(
    make_fresh_app, sandbox, fake_clock
):
    # A thread held up between taking its grant and writing its request (here: checking its
    # pooled connection; under load: the GIL, the scheduler) would reach the provider together
    # with the calls granted after it. The connection confirms the grant right before the write.
    endpoint = "GET /v1/checkout/sessions/{id}"
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=1, CLOCK=fake_clock)
    real_get_conn, held = urllib3.HTTPConnectionPool._get_conn, []

    def held_up(pool, *args, **kwargs):
        conn = real_get_conn(pool, *args, **kwargs)
        fake_clock.advance(guard.GRANT_FRESH_SECONDS + 0.1)
        held.append(fake_clock.time())
        return conn

    with app.app_context():
        provider_guard = guard.get()
        window = provider_guard.budget.endpoint_prefix + endpoint
        with guard.customer_call(), pytest.MonkeyPatch.context() as patch:
            patch.setattr(urllib3.HTTPConnectionPool, "_get_conn", held_up)
            with pytest.raises(gateway.ProviderRefused):  # no such session: an answer all the same
                gateway.retrieve_session("cs_test_nothing")
        grants = provider_guard.shared.connection().zrange(window, 0, -1, withscores=True)
    assert held and sandbox.request_count() == 1
    # One place in the window (the stale grant went back), taken after the hold: the request went
    # out with the grant counted at the time it was written.
    assert len(grants) == 1 and grants[0][1] >= held[0] - 0.01, (grants, held)


def test_confirming_a_fresh_grant_keeps_it_and_a_stale_one_is_exchanged_for_a_new_place_in_the_window(
    make_fresh_app, fake_clock
):
    endpoint = "GET /v1/events"
    app = make_fresh_app(STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=1, STRIPE_CUSTOMER_WAIT_SECONDS=0.0, CLOCK=fake_clock)
    with app.app_context(), guard.customer_call():
        provider_guard = guard.get()
        window = provider_guard.budget.endpoint_prefix + endpoint
        grant = provider_guard.take_token(endpoint)
        assert provider_guard.confirm(grant) is grant
        with pytest.raises(guard.Shed, match="provider budget for GET /v1/events"):
            provider_guard.take_token(endpoint)  # 1 in any window: spent
        fake_clock.advance(guard.GRANT_FRESH_SECONDS + 0.05)
        renewed = provider_guard.confirm(grant)  # its own place goes back first, so there is room
        members = provider_guard.shared.connection().zrange(window, 0, -1)
    assert renewed.member != grant.member and [m.decode() for m in members] == [renewed.member]
