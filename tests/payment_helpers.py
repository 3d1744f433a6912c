"""Helpers shared by the storefront and payment tests: the one customer driving the storefront
(Shopper, over the test client or over real HTTP), Stripe-signed webhook posts, and the app
served over real HTTP so the sandbox can deliver to it."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

import requests
from sqlalchemy import select
from werkzeug.serving import make_server
from werkzeug.test import TestResponse
from werkzeug.wsgi import ClosingIterator

from factories import DEFAULT_SKU, place_order_for
from lane_priority import start_thread
from shop import clock
from shop.extensions import db
from shop.models import Order
from shop.payments.start import start_payment
from shop.provider import guard, transport
from shop.stripe_sandbox.server import QuietRequestHandler
from support import csrf_token, log_in, wait_until

WEBHOOK_SECRET = "whsec_test_secret"
JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}


class Shopper:
    """One customer's browser on the storefront: its own cookies, and the CSRF token its pages
    render. Over the app's test client (`Shopper(app)`; the catalog's sku -> variant id from
    `skus`, else from the app of make_shop), or over real HTTP to a shop served elsewhere
    (`Shopper.over_http(base_url, skus)`). Forms are posted as a browser posts them (HTML);
    order data is read as JSON."""

    def __init__(self, app, skus: dict[str, int] | None = None, *, client=None):
        self.app = app
        self.client = app.test_client() if client is None else client
        self.skus = app.skus if skus is None else skus
        self.token = csrf_token(self.client, "/")
        # Each shopper is its own customer, with its own address: UNPAID_ORDERS_PER_CLIENT counts
        # live orders per address too, and tests with many shoppers are not about that limit.
        self.email = f"ann.{uuid.uuid4().hex[:10]}@example.com"
        # And its own client address (UNPAID_ORDERS_PER_ADDRESS), over the test client.
        if client is None:
            octets = (random.randrange(256), random.randrange(256), random.randrange(1, 255))
            self.client.environ_base["REMOTE_ADDR"] = "10.{}.{}.{}".format(*octets)

    @classmethod
    def over_http(cls, base_url: str, skus: dict[str, int], session: requests.Session | None = None) -> Shopper:
        """The shopper of a shop served at `base_url`; in `session` (its cookies), if given."""
        return cls(None, skus, client=HttpClient(base_url, session=session))

    # -- the cart --------------------------------------------------------------------------------

    def post(self, url: str, headers=HTML, **form):
        """A storefront form posted with this browser's CSRF token."""
        return self.client.post(url, headers=headers, data={"csrf_token": self.token, **form})

    def add(self, sku: str = DEFAULT_SKU, quantity=1, headers=HTML):
        return self.post("/cart/items", headers=headers, variant_id=self.skus[sku], quantity=quantity)

    def cart_page(self) -> str:
        return self.client.get("/cart", headers=HTML).get_data(as_text=True)

    # -- checkout --------------------------------------------------------------------------------

    def checkout_cart(self, email: str | None = None, headers=HTML):
        """Check out the cart as it is (as this shopper's address unless one is given); returns the answer."""
        return self.post("/checkout", headers=headers, email=email or self.email)

    def checkout(self, sku: str = DEFAULT_SKU, quantity: int = 1, email: str | None = None):
        """Add `quantity` x `sku` to the cart and check out; returns the checkout's answer."""
        r = self.add(sku, quantity)
        assert r.status_code == 303, r.get_data(as_text=True)
        return self.checkout_cart(email)

    def buy(self, sku: str = DEFAULT_SKU, quantity: int = 1, email: str | None = None) -> str:
        """Check out, placed: returns the order's reference (where the checkout sent the browser)."""
        placed = self.checkout(sku, quantity, email)
        assert placed.status_code == 303, placed.get_data(as_text=True)
        return placed.headers["Location"].rsplit("/", 1)[-1]

    def place(self, sku: str = DEFAULT_SKU, quantity: int = 1) -> dict:
        """Check out and return the order's JSON (its payment session started)."""
        r = self.checkout(sku, quantity)
        assert r.status_code == 303, r.get_data(as_text=True)
        order = self.latest()
        assert order["status"] == "PaymentInitiated", order
        assert r.headers["Location"] == order["payment"]["url"]
        return order

    # -- orders ----------------------------------------------------------------------------------

    def latest(self) -> dict:
        refs = self.client.get("/orders", headers=JSON).get_json()["orders"]
        return self.order(refs[0]["reference"])

    def get_order(self, ref: str, **query):
        """The order page's JSON answer, whatever it is (`token=` as a link carrying it would)."""
        return self.client.get(f"/orders/{ref}", headers=JSON, query_string=query)

    def order(self, ref: str) -> dict:
        r = self.get_order(ref)
        assert r.status_code == 200, r.status_code
        return r.get_json()

    def pay(self, ref: str):
        return self.post(f"/orders/{ref}/pay", headers=JSON)

    def cancel(self, ref: str, version, headers=JSON, **form):
        return self.post(f"/orders/{ref}/cancel", headers=headers, version=version, **form)

    def come_back(self, ref: str, session_id: str):
        """The browser returning from the hosted page to the success URL."""
        return self.client.get(f"/checkout/return?order={ref}&session_id={session_id}")


class HttpClient:
    """The test client's get and post, made over real HTTP (requests, with a cookie jar) to a
    shop served at `base_url`, answered as the test client answers (werkzeug's TestResponse;
    redirects are not followed)."""

    def __init__(self, base_url: str, timeout: float = 30, session: requests.Session | None = None):
        self.base_url, self.timeout = base_url, timeout
        self.session = requests.Session() if session is None else session

    def get(self, path: str, headers=None, query_string=None):
        return self._answer(self.session.get(self.base_url + path, headers=headers, params=query_string, **self._how))

    def post(self, path: str, headers=None, data=None):
        return self._answer(self.session.post(self.base_url + path, headers=headers, data=data, **self._how))

    @property
    def _how(self) -> dict:
        return {"allow_redirects": False, "timeout": self.timeout}

    @staticmethod
    def _answer(r: requests.Response) -> TestResponse:
        return TestResponse(r.content, r.status_code, list(r.headers.items()), request=None)


def order_id(app, ref: str) -> int:
    with app.app_context():
        oid = db.session.query(Order.id).filter(Order.reference == ref).scalar()
        db.session.remove()
        return oid


# -- webhooks ------------------------------------------------------------------------------


def signature(body: bytes, secret: str = WEBHOOK_SECRET, timestamp: int | None = None) -> str:
    """Exactly what Stripe sends: t=<unix time>,v1=<HMAC-SHA256 of "t.body">."""
    t = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def post_webhook(client, event, *, secret: str = WEBHOOK_SECRET, timestamp: int | None = None, headers=None):
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    sent = {"Stripe-Signature": signature(body, secret, timestamp), "Content-Type": "application/json"}
    sent.update(headers or {})
    return client.post("/webhooks/stripe", data=body, headers=sent)


def sandbox_event(sandbox, type: str, session_id: str) -> dict:
    """The event the sandbox emitted for that session (as Stripe would have sent it)."""
    found = [r["event"] for r in sandbox.events(type) if r["event"]["data"]["object"]["id"] == session_id]
    assert found, f"the sandbox emitted no {type} for {session_id}"
    return found[-1]


def paid_at_provider(shopper, sandbox) -> tuple[dict, dict]:
    """An order whose session was just paid at the sandbox; returns (order JSON, completed event)."""
    order = shopper.place()
    sid = order["payment"]["session_id"]
    sandbox.set_outcome(sid, "paid")
    return order, sandbox_event(sandbox, "checkout.session.completed", sid)


def stripe_event(type: str, session: dict, event_id: str = "evt_test_1") -> dict:
    """A hand-built event shaped like Stripe's, for sessions the sandbox never saw."""
    return {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": int(time.time()),
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": type,
        "data": {"object": session},
    }


# -- the app over real HTTP ------------------------------------------------------------------


def _then(body, ended) -> Iterator[bytes]:
    yield from body
    ended()


@contextlib.contextmanager
def served(build_app) -> Iterator[tuple]:
    """Serve the app `build_app(base_url)` returns on a free 127.0.0.1 port in a thread, so its
    PUBLIC_BASE_URL can be its real address; yields (app, base_url). On the way out it waits for
    the requests already in the app to end (a page's poll the browser left mid-flight): each holds
    a database connection until then, and the app's engine is disposed right after."""
    holder = []
    in_flight = [0]
    changed = threading.Condition()

    def app(environ, start):
        with changed:
            in_flight[0] += 1
        done = []

        def ended():
            with changed:
                if not done:
                    done.append(True)
                    in_flight[0] -= 1
                    changed.notify_all()

        try:
            body = holder[0](environ, start)
        except BaseException:
            ended()
            raise
        # Ended when its body has been read to the end (a streamed one holds its app context until
        # then), or closed early. Not only at close: werkzeug closes it only after draining the
        # socket, which waits for a keep-alive client to hang up.
        return ClosingIterator(_then(body, ended), [getattr(body, "close", lambda: None), ended])

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietRequestHandler)
    base_url = f"http://127.0.0.1:{server.port}"
    holder.append(build_app(base_url))
    thread = start_thread(server.serve_forever, poll_interval=0.05)
    try:
        yield holder[0], base_url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        with changed:  # one that never ends is left to make_fresh_app's check of the pool
            changed.wait_for(lambda: in_flight[0] == 0, timeout=30)


@contextlib.contextmanager
def live_shop(make_fresh_app, sandbox, **config):
    """The shop served over real HTTP and registered as the sandbox's webhook endpoint, exactly
    as `flask shop stripe-register-webhook` does it: no STRIPE_WEBHOOK_SECRET, so deliveries are
    verified with the secret registration stored. Yields the app."""
    from shop.provider.registration import register_webhook

    def build(base_url):
        settings = dict(
            STRIPE_API_BASE=sandbox.base_url,
            STRIPE_SESSION_MIN_SECONDS=60,
            STRIPE_WEBHOOK_SECRET=None,
            PUBLIC_BASE_URL=base_url,
        )
        settings.update(config)
        return make_fresh_app(**settings)

    with served(build) as (app, _base_url):
        with app.app_context():
            register_webhook()
            db.session.remove()
        yield app


def wait_for_status(shopper: Shopper, ref: str, status: str, timeout: float = 5.0) -> dict:
    return wait_until(
        lambda: (lambda o: o if o["status"] == status else None)(shopper.order(ref)),
        timeout=timeout,
        what=f"order {ref} to be {status}",
    )


# -- the worker's day, in-process ------------------------------------------------------------


def run_due_commands(app, now) -> None:
    """What the worker does by `now` with scheduled commands (the payment deadline included)."""
    from sqlalchemy import select

    from shop.models import ScheduledCommand
    from shop.outbox.dispatch import run_command

    with app.app_context():
        due = (
            db.session.execute(
                select(ScheduledCommand.id).where(
                    ScheduledCommand.status == "pending", ScheduledCommand.next_attempt_at <= now
                )
            )
            .scalars()
            .all()
        )
        db.session.rollback()
        for command_id in due:
            run_command(command_id, now=now)
        db.session.remove()


def run_everything(app, now=None) -> None:
    """Deliveries, then every command due by `now`, a few rounds (what one leads to, the next runs)."""
    from shop.domain.deadlines import utcnow
    from shop.outbox.dispatch import drain_deliveries

    now = now or utcnow()
    for _ in range(3):
        with app.app_context():
            drain_deliveries(now=now)
            db.session.remove()
        run_due_commands(app, now)


def place_and_pay(make_fresh_app, sandbox, sku: str = "SOCK-M", quantity: int = 2, also: dict[str, int] | None = None):
    """A shop on the sandbox with one order of `quantity` x `sku` (and `also`, sku -> quantity, in
    the cart first), paid at the sandbox and applied (as the console's reconcile applies it):
    (app, order id, its total, the catalog's skus)."""
    from factories import seed_catalog_rows
    from shop.payments.apply import reconcile_order

    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60)
    skus = seed_catalog_rows(app)
    shopper = Shopper(app, skus)
    for other, units in (also or {}).items():
        assert shopper.add(other, units).status_code == 303
    order = shopper.place(sku, quantity)
    sandbox.set_outcome(order["payment"]["session_id"], "paid")
    oid = order_id(app, order["reference"])
    with app.app_context():
        assert reconcile_order(oid).outcome == "paid"
        total = db.session.get(Order, oid).total
        db.session.remove()
    return app, oid, total, skus


@dataclass(frozen=True)
class PaidOrder:
    """A paid order (place_and_pay) and an operator's logged-in console client beside it."""

    app: object
    client: object
    token: str  # the console session's CSRF token
    oid: int
    reference: str
    access_token: str
    email: str
    currency: str
    total: int
    skus: dict


def paid_with_operator(make_fresh_app, sandbox, sku: str = "SOCK-M", quantity: int = 2) -> PaidOrder:
    """place_and_pay, then its work run (the confirmation sent) and an operator logged in."""
    app, oid, total, skus = place_and_pay(make_fresh_app, sandbox, sku, quantity)
    run_everything(app)
    client = app.test_client()
    token = log_in(app, client)
    with app.app_context():
        order = db.session.get(Order, oid)
        found = (order.reference, order.access_token, order.email, order.currency)
        db.session.remove()
    return PaidOrder(app, client, token, oid, *found, total, skus)


@dataclass(frozen=True)
class Timeout:
    """A timeout the transport gave one request: (connect, read) in seconds, the clock's
    monotonic() read just before, and the deadline of the calls made then (None: none)."""

    connect: float
    read: float
    at: float
    deadline: float | None


@dataclass(frozen=True)
class RetryDecision:
    """Whether a 429 was retried: the wait it asked for, the clock before deciding, the deadline."""

    wait: float
    at: float
    deadline: float | None
    retried: bool


class ProviderTransportLog:
    """What the provider's transport decided in this thread (shop.provider.transport), read where
    it decides it: the timeout of each request it sent, and each 429's retry or not. For tests
    that pin how a call is kept within its caller's time instead of timing it. The clock is read
    before the transport reads it, so what was left by the deadline is never overstated."""

    def __init__(self, monkeypatch):
        self.timeouts: list[Timeout] = []
        self.retries: list[RetryDecision] = []
        mine = threading.get_ident()
        client = transport.GuardedHttpClient
        timeout, retry_429 = client._timeout, client._retry_429

        def timeout_given(self_):
            at, deadline = clock.current().monotonic(), guard.current().deadline
            value = timeout.fget(self_)
            if threading.get_ident() == mine:
                connect, read = value if isinstance(value, tuple) else (value, value)
                self.timeouts.append(Timeout(connect, read, at, deadline))
            return value

        def retry_decided(self_, rheaders, wait):
            at, deadline = clock.current().monotonic(), guard.current().deadline
            retried = retry_429(self_, rheaders, wait)
            if threading.get_ident() == mine:
                self.retries.append(RetryDecision(wait, at, deadline, retried))
            return retried

        monkeypatch.setattr(client, "_timeout", property(timeout_given, timeout.fset))
        monkeypatch.setattr(client, "_retry_429", retry_decided)

    def assert_within_deadline(self) -> None:
        """Every request's answer was waited for no longer than its deadline left, and every 429
        retried only when its wait and one more attempt fit before the deadline."""
        for t in self.timeouts:
            assert t.deadline is not None, f"a request was sent without a deadline: {self.timeouts}"
            assert t.read <= max(0.05, t.deadline - t.at) and t.connect <= t.read, f"a timeout past the deadline: {t}"
        for r in self.retries:
            assert r.deadline is not None, f"a 429 retried without a deadline: {self.retries}"
            fits = r.at + r.wait + transport.MIN_ATTEMPT_SECONDS <= r.deadline
            assert not r.retried or fits, f"a 429 retried past the deadline: {r}"


def session_of(order_id: int) -> str:
    sid = db.session.execute(select(Order.payment_session_id).where(Order.id == order_id)).scalar_one()
    db.session.rollback()
    return sid


def awaiting_provider() -> tuple[int, str]:
    """A PaymentInitiated order with its hosted session at the sandbox (in an app context; the
    catalog seeded)."""
    order_id = place_order_for().order_id
    assert start_payment(order_id).status == "started"
    return order_id, session_of(order_id)
