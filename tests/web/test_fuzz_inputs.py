"""Hostile input, generated: what nobody well-meaning sends, built by hypothesis and sent through
the test client to the webhook and to every POST route of the storefront and the console.

How to run:
    CI profile (fixed seed, bounded; about a minute per database on a 2-core machine):
        pytest -q tests/web/test_fuzz_inputs.py
    Long profile (random seed; at least N inputs over the four tests, each input one request):
        BACKSTOP_FUZZ_EXAMPLES=10000 pytest -q -s tests/web/test_fuzz_inputs.py
    On PostgreSQL add DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test.
    Each test prints how many inputs it sent and how long that took (shown with -s).

What must hold for every input:
- never a 5xx (the app's error handler turns a crash into a 500: that is what is caught);
- the webhook answers 413 for a body over 1,000,000 bytes, 400 only for the reasons in
  docs/REFERENCE.md (Routes, Webhook: no or bad signature, stale timestamp, empty or unparseable body,
  not an event), 200 for everything else; every delivery, accepted or rejected, leaves exactly
  one receipt that the console's webhook list shows first;
- a refused input (any 4xx) changes no row in any table (orders, stock, carts, outbox, commands,
  refunds, warnings, operators; only the webhook's own receipt is written);
- a browser never acts on, or sees, another browser's order without its access token.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import select, text

from factories import seed_catalog_rows
from payment_helpers import WEBHOOK_SECRET, Shopper, order_id, signature
from shop.extensions import db
from shop.models import Order, OutboxDelivery, OutboxEvent, RestoreWarning, ScheduledCommand, WebhookReceipt
from shop.provider.gateway import EVENT_TYPES
from shop.webhooks import MAX_BODY
from support import REPO_ROOT, log_in

# Stripe's own example checkout.session, event and refund (from its fixtures, kept with the
# tests so a clean clone has them).
FIXTURES = str(REPO_ROOT / "tests" / "fixtures" / "stripe_examples.json")
JSON = {"Accept": "application/json"}
TOLERANCE = 300  # the Stripe SDK's default signature tolerance, in seconds

# -- profiles ----------------------------------------------------------------------------------

LONG_TOTAL = int(os.environ.get("BACKSTOP_FUZZ_EXAMPLES", "0") or 0)
# Share of the inputs per test; the CI numbers keep the module near a minute per database. The
# three open-ended tests' shares add up to 1, so they alone reach the long total: the size test has
# only 70 distinct inputs (35 sizes, with or without a Content-Length), and hypothesis stops a test
# whose inputs are exhausted (with 0.49 for the POST routes a long run of 10,000 sent 9,973).
SHARES = {
    "webhook_bytes": (0.25, 250),
    "webhook_mutated": (0.25, 150),
    "webhook_size": (0.01, 8),
    "post_routes": (0.50, 450),
}


def _examples(name: str) -> int:
    share, ci = SHARES[name]
    return max(ci, int(LONG_TOTAL * share) + 1) if LONG_TOTAL else ci


def _settings(name: str):
    return settings(
        max_examples=_examples(name),
        deadline=None,
        database=None,
        derandomize=not LONG_TOTAL,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


@pytest.fixture
def tally(request):
    """Counts the requests a test sent and prints the count and the time at its end."""
    counter = {"inputs": 0, "started": time.monotonic(), "answers": Counter()}
    yield counter
    elapsed = time.monotonic() - counter["started"]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n{request.node.name}: {counter['inputs']} inputs in {elapsed:.1f} s")
        if os.environ.get("BACKSTOP_FUZZ_VERBOSE"):
            for key, n in sorted(counter["answers"].items(), key=str):
                print(f"    {' '.join(map(str, key))}: {n}")


# -- values a sender might put anywhere ------------------------------------------------------

ODD_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "\u2028",
    "\r\n",
    "é",
    "🙂",
    "%00",
    "../..",
    "' OR 1=1 --",
    "<script>x</script>",
    "１２",
    "NaN",
    "-0",
    "1e9",
    "0x10",
    " 7 ",
    "\t",
]
texts = st.one_of(
    st.text(max_size=24),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=12),  # lone surrogates too
    st.sampled_from(ODD_TEXT),
)
numbers = st.one_of(
    st.integers(-10, 200),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**32, 2**63, -(2**63) - 1, 10**40]),
)
json_scalars = st.one_of(st.none(), st.booleans(), numbers, st.floats(), texts)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=10,
)


def _deep(depth: int, kind: str) -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" + "}" * depth)


deep_json = st.builds(_deep, st.sampled_from([50, 900, 1100, 5000, 100_000]), st.sampled_from(["list", "dict"]))


def _snapshot_statement(dialect: str):
    """One statement reading every row of every table but the webhook's receipts, each row as JSON
    text: what a refused input must not change, in one round trip (a SELECT per table was most of
    an input's time on PostgreSQL)."""
    build = "json_build_object({})::text" if dialect == "postgresql" else "json_object({})"
    parts = []
    for table in db.metadata.sorted_tables:
        if table.name == "webhook_receipts":
            continue
        pairs = ", ".join(f"'{c.name}', \"{c.name}\"" for c in table.columns)
        parts.append(f"SELECT '{table.name}' AS t, {build.format(pairs)} AS r FROM \"{table.name}\"")
    return text(" UNION ALL ".join(parts))


def _snapshot(app) -> dict:
    with app.app_context():
        cache = app.extensions.setdefault("fuzz_snapshot", {})
        if "statement" not in cache:
            cache["statement"] = _snapshot_statement(db.engine.dialect.name)
        out = {table.name: [] for table in db.metadata.sorted_tables if table.name != "webhook_receipts"}
        with db.engine.connect() as conn:
            for name, row in conn.execute(cache["statement"]):
                out[name].append(row)
        db.session.remove()
        return {name: sorted(rows) for name, rows in out.items()}


# The console's audit trail records every POST of a logged-in operator, refused ones too, as the
# webhook's receipts record every delivery: checked on their own, not as a change of state.
RECORDS = ("operator_actions",)


def _changed(before: dict, after: dict) -> list[str]:
    return [name for name in before if name not in RECORDS and before[name] != after[name]]


def _new_audit_rows(before: dict, after: dict) -> list[dict]:
    old, new = before.get("operator_actions", []), after.get("operator_actions", [])
    assert all(row in new for row in old), "an audit row was changed or removed"
    return [json.loads(row) for row in new if row not in old]


# -- the world the inputs are sent to ---------------------------------------------------------


@dataclass
class World:
    app: object
    ann: Shopper  # placed ann_order (PaymentInitiated at the sandbox)
    bob: Shopper  # placed bob_order; never ann's
    operator: object  # a logged-in console client
    operator_token: str
    ann_order: dict
    bob_order: dict
    ann_order_id: int
    ann_access_token: str
    variant_ids: list[int]
    post_rules: list = field(default_factory=list)
    answers: Counter = field(default_factory=Counter)


def _world(make_fresh_app, sandbox) -> World:
    # Generated logins fail by the hundred: the login throttle (tests/web/test_door.py pins it) would
    # answer the operator's own login 429 before the generated inputs are done. Likewise a paid
    # order is replaced by a fresh checkout at the inputs' pace, which may outrun the provider's
    # session budget (the line then takes the order: tests/payments/test_checkout_queue.py). And
    # unsigned deliveries come by the hundred from one address: the webhook's noise throttle
    # (tests/web/test_webhook_noise.py pins it) would turn a replayed input's 400 into a 429.
    app = make_fresh_app(
        WEBHOOK_NOISE_PER_MINUTE=1_000_000,
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_SESSION_MIN_SECONDS=60,
        STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET,
        LOGIN_MAX_FAILURES_PER_ACCOUNT=1000,
        LOGIN_MAX_FAILURES_PER_ADDRESS=100_000,
        STRIPE_RATE_LIMIT_PER_SECOND=10_000,
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=10_000,
    )
    skus = seed_catalog_rows(app)
    ann = Shopper(app, skus)
    ann.email = "ann@example.com"  # one of ann's secrets the inputs must never reveal
    ann_order = ann.place()
    bob = Shopper(app, skus)
    r = bob.checkout(email="bob@example.com")
    assert r.status_code == 303
    bob_order = bob.latest()
    operator = app.test_client()
    operator_token = log_in(app, operator)
    ann_id = order_id(app, ann_order["reference"])
    with app.app_context():
        # A dead delivery, a dead command and an open restore warning, so the console's generated
        # ids (small numbers) also hit rows its actions can act on.
        event = OutboxEvent(order_id=ann_id, name="OrderPaid", payload={"order_id": ann_id})
        db.session.add(event)
        db.session.flush()
        db.session.add(
            OutboxDelivery(
                event_id=event.id,
                handler="send_order_confirmation",
                order_id=ann_id,
                status="dead",
                attempts=5,
                last_error="fuzz",
            )
        )
        db.session.add(ScheduledCommand(kind="send_email", order_id=ann_id, payload={}, status="dead", attempts=5))
        db.session.add(RestoreWarning(order_id=ann_id, variant_id=skus["NB-A5-DOT"], quantity=1, reason="fuzz"))
        token = db.session.execute(select(Order.access_token).where(Order.id == ann_id)).scalar_one()
        db.session.commit()
        db.session.remove()
    return World(app, ann, bob, operator, operator_token, ann_order, bob_order, ann_id, token, sorted(skus.values()))


# -- the webhook ------------------------------------------------------------------------------


def _is_event(value) -> bool:
    """What the webhook must accept once the signature is good: a JSON object shaped like an event."""
    event_id = value.get("id") if isinstance(value, dict) else None
    return (
        isinstance(value, dict)
        and value.get("object") != "v2.core.event"
        and isinstance(value.get("type"), str)
        and (
            event_id is None
            or (
                isinstance(event_id, str)
                and 0 < len(event_id) <= 255
                and not any(ord(c) < 32 or ord(c) == 127 for c in event_id)
            )
        )
        and isinstance(value.get("data"), dict)
        and isinstance(value["data"].get("object"), dict)
    )


def _expected_status(body: bytes, signed_ok: bool) -> int:
    if len(body) > MAX_BODY:
        return 413
    if not body.strip() or not signed_ok:
        return 400
    try:
        event = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return 400
    return 200 if _is_event(event) else 400


@st.composite
def signatures(draw, body: bytes) -> tuple[str | None, bool]:
    """A Stripe-Signature header for `body` and whether it is one Stripe would have sent."""
    now = int(time.time())
    kind = draw(
        st.sampled_from(
            [
                "valid",
                "valid",
                "valid",
                "missing",
                "garbage",
                "wrong_secret",
                "other_body",
                "stale",
                "future",
                "extra_schemes",
                "no_v1",
                "bad_time",
            ]
        )
    )
    if kind == "valid":
        return signature(body, timestamp=now - draw(st.integers(0, TOLERANCE - 30))), True
    if kind == "missing":
        return None, False
    if kind == "garbage":
        return draw(
            st.one_of(
                st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
                st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=80),
                st.sampled_from(
                    [
                        "t=,v1=",
                        "t=1,v1=",
                        "v1=00",
                        ",,,",
                        "t=99999999999999999999,v1=ab",
                        "t=-1,v1=ab",
                        "t=1e3,v1=ab",
                        "t=1" + ",v1=a" * 500,
                    ]
                ),
            )
        ), False
    if kind == "wrong_secret":
        return signature(body, secret="whsec_" + draw(st.text("abcdef0123", min_size=1, max_size=20))), False
    if kind == "other_body":
        return signature(body + draw(st.binary(min_size=1, max_size=8))), False
    if kind == "stale":  # a replay of an old delivery: signed correctly, long ago
        return signature(body, timestamp=now - draw(st.integers(TOLERANCE + 30, 10**9))), False
    if kind == "future":  # Stripe's check only refuses old timestamps
        return signature(body, timestamp=now + draw(st.integers(0, 10**6))), True
    if kind == "extra_schemes":
        good = signature(body, timestamp=now)
        t, v1 = good.split(",")
        return f"{t},v0=deadbeef,v1={'0' * 64},{v1}", True
    if kind == "no_v1":
        return signature(body, timestamp=now).replace("v1=", "v0="), False
    return signature(body).replace("t=", "t=x"), False


def _post_webhook(client, body: bytes, sig: str | None, *, chunked: bool = False, content_type=None):
    headers = {"Content-Type": content_type or "application/json"}
    # Set in the environ, as a server hands any latin-1 header on (the test client's header
    # check would refuse control characters that a raw socket can still send).
    environ = {} if sig is None else {"HTTP_STRIPE_SIGNATURE": sig}
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
        # What a WSGI server hands on for a chunked body: a stream that ends, no Content-Length.
        return client.post(
            "/webhooks/stripe",
            input_stream=io.BytesIO(body),
            headers=headers,
            environ_overrides={**environ, "wsgi.input_terminated": True},
        )
    return client.post("/webhooks/stripe", data=body, headers=headers, environ_overrides=environ)


def _receipt_ids(app) -> list[int]:
    with app.app_context():
        ids = list(db.session.execute(select(WebhookReceipt.id).order_by(WebhookReceipt.id)).scalars())
        db.session.remove()
        return ids


def _check_delivery(world: World, body: bytes, sig, expected: int, **post) -> None:
    """Send one delivery and check every property of its answer, its receipt and the state."""
    app = world.app
    note(f"body ({len(body)} bytes): {body[:300]!r}; signature: {sig!r}; {post}")
    before, receipts_before = _snapshot(app), _receipt_ids(app)
    r = _post_webhook(app.test_client(), body, sig, **post)
    world.answers[(r.status_code, r.get_json(silent=True) and r.get_json().get("outcome"))] += 1
    answer = r.get_data(as_text=True)[:500]
    assert r.status_code < 500, answer
    assert r.status_code == expected, answer
    with app.app_context():
        new = (
            db.session.execute(select(WebhookReceipt).where(WebhookReceipt.id.notin_(receipts_before or [0])))
            .scalars()
            .all()
        )
        new = [(x.id, x.outcome, x.http_status) for x in new]
        db.session.remove()
    assert len(new) == 1, f"deliveries must leave exactly one receipt, found {new}"
    receipt_id, outcome, status = new[0]
    assert status == r.status_code
    assert (outcome == "rejected") == (r.status_code in (400, 413)), new
    changed = _changed(before, _snapshot(app))
    if r.status_code >= 400:
        assert not changed, f"a rejected delivery changed {changed}"
    listed = world.operator.get("/console/webhooks", headers=JSON)
    assert listed.status_code == 200
    assert listed.get_json()["webhooks"][0]["id"] == receipt_id
    return r, changed


def _session_object(order: dict, order_id: int) -> dict:
    """Stripe's example checkout.session, made into the paid session of `order`."""
    with open(FIXTURES) as f:
        session = json.load(f)["resources"]["checkout.session"]
    session.update(
        id=order["payment"]["session_id"],
        client_reference_id=order["reference"],
        metadata={"order_id": str(order_id)},
        amount_total=order["total"],
        amount_subtotal=order["total"],
        currency=order["currency"],
        status="complete",
        payment_status="paid",
        url=None,
    )
    return session


def _real_event(order: dict, order_id: int, event_type: str = "checkout.session.completed") -> dict:
    """Stripe's example event around that session."""
    with open(FIXTURES) as f:
        event = json.load(f)["resources"]["event"]
    event.update(
        type=event_type,
        created=int(time.time()),
        api_version="2024-06-20",
        data={"object": _session_object(order, order_id)},
    )
    return event


def _paths(value, prefix=()) -> list[tuple]:
    """Every place in a JSON value (the root too): dict keys and list indexes, depth first."""
    out = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            out += _paths(inner, prefix + (key,))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            out += _paths(inner, prefix + (index,))
    return out


def _mutated(event, path: tuple, op: str, replacement):
    if not path:
        return replacement
    event = json.loads(json.dumps(event))
    parent = event
    for step in path[:-1]:
        parent = parent[step]
    if op == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return event


def test_webhook_deliveries_of_random_bytes_json_and_signatures(make_fresh_app, sandbox, tally):
    world = _world(make_fresh_app, sandbox)
    world.answers = tally["answers"]
    real = json.dumps(_real_event(world.ann_order, world.ann_order_id)).encode()

    bodies = st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.builds(
            lambda t, o, i: json.dumps({"id": i, "type": t, "object": "event", "data": {"object": o}}).encode(),
            st.one_of(st.sampled_from(EVENT_TYPES), texts),
            st.dictionaries(texts, json_values, max_size=4),
            st.one_of(st.none(), texts),
        ),
        st.integers(0, len(real) - 1).map(lambda n: real[:n]),  # truncated
        deep_json.map(str.encode),
        st.sampled_from(
            [
                b"",
                b"   ",
                b"\n\t",
                b"null",
                b"[]",
                b"{}",
                b'"x"',
                b"1",
                b"NaN",
                b'{"object": "v2.core.event", "type": "x", "data": {"object": {}}}',
            ]
        ),
    )

    @_settings("webhook_bytes")
    @given(st.data())
    def deliver(data):
        body = data.draw(bodies, label="body")
        sig, signed_ok = data.draw(signatures(body), label="signature")
        content_type = data.draw(
            st.sampled_from(
                [
                    "application/json",
                    "text/plain",
                    "application/x-www-form-urlencoded",
                    "multipart/form-data; boundary=x",
                    "",
                ]
            ),
            label="content type",
        )
        tally["inputs"] += 1
        _check_delivery(world, body, sig, _expected_status(body, signed_ok), content_type=content_type)

    deliver()


def _another_order(world: World) -> dict:
    """A fresh order waiting for its money; its unit is put on the shelf first, so a long run does
    not run out of stock."""
    with world.app.app_context():
        db.session.execute(
            text("UPDATE inventory SET on_hand = on_hand + 1 WHERE variant_id = :v"), {"v": world.ann.skus["NB-A5-DOT"]}
        )
        db.session.commit()
        db.session.remove()
    return world.ann.place()


def test_webhook_a_real_event_with_one_field_of_the_wrong_type(make_fresh_app, sandbox, tally):
    """Start from Stripe's own example objects made into the paid session of a real order, then
    change one place (at any depth) to any JSON value, or delete it; sign it correctly."""
    world = _world(make_fresh_app, sandbox)
    world.answers = tally["answers"]
    # Orders still waiting for their money: one that an input paid is replaced by a new one, so
    # later inputs meet the paths of an unpaid order too, not only "noop".
    unpaid = [world.ann_order, _another_order(world), _another_order(world)]
    fresh_ids = itertools.count(1)

    @_settings("webhook_mutated")
    @given(st.data())
    def deliver(data):
        event_type = data.draw(st.sampled_from(EVENT_TYPES), label="type")
        slot = data.draw(st.integers(0, len(unpaid) - 1), label="order")
        order = unpaid[slot]
        event = _real_event(order, order_id(world.app, order["reference"]), event_type)
        if data.draw(st.sampled_from([True] * 6 + [False]), label="fresh id"):  # else a redelivery
            event["id"] = f"evt_fuzz_{next(fresh_ids)}"
        path = data.draw(st.sampled_from(_paths(event)), label="path")
        op = data.draw(st.sampled_from(["replace", "replace", "delete"]) if path else st.just("replace"))
        value = data.draw(json_values, label="value")
        body = json.dumps(_mutated(event, path, op, value)).encode()
        sig, signed_ok = data.draw(
            st.one_of(st.just(None).map(lambda _: (signature(body), True)), signatures(body)), label="signature"
        )
        tally["inputs"] += 1
        r, changed = _check_delivery(world, body, sig, _expected_status(body, signed_ok))
        if r.status_code == 200 and r.get_json()["outcome"] == "paid":
            assert "orders" in changed  # the snapshot sees what an input changes
            unpaid[slot] = _another_order(world)

    deliver()


def test_webhook_bodies_at_and_around_the_size_cap(make_fresh_app, sandbox, tally):
    """Just under, at and over 1,000,000 bytes, with and without a Content-Length; signed correctly
    (a valid event padded with JSON whitespace), so only the size decides."""
    world = _world(make_fresh_app, sandbox)
    world.answers = tally["answers"]
    event = json.dumps(
        {"id": "evt_big", "type": "customer.created", "object": "event", "data": {"object": {"id": "cus_1"}}}
    ).encode()

    @_settings("webhook_size")
    @given(
        st.one_of(st.integers(MAX_BODY - 16, MAX_BODY + 16), st.sampled_from([MAX_BODY * 2, 5_000_000])), st.booleans()
    )
    def deliver(size, chunked):
        body = event + b" " * (size - len(event))
        tally["inputs"] += 1
        _check_delivery(world, body, signature(body), 413 if size > MAX_BODY else 200, chunked=chunked)

    deliver()


# -- every POST route of the storefront and the console -----------------------------------------

_ARG = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")
FIELD_NAMES = [
    "csrf_token",
    "variant_id",
    "quantity",
    "email",
    "version",
    "token",
    "reason",
    "action",
    "note",
    "next",
    "what",
    "password",
]


def _post_rules(app) -> list:
    rules = [
        r
        for r in app.url_map.iter_rules()
        if "POST" in r.methods and r.endpoint != "webhooks.stripe_webhook" and not r.endpoint.startswith("static")
    ]
    assert {r.endpoint.split(".")[0] for r in rules} >= {"storefront", "console"}
    return sorted(rules, key=lambda r: r.rule)


def _path_values(world: World, converter: str):
    ids = st.one_of(
        st.integers(1, 3).map(str),
        st.integers(1, 3).map(str),
        st.integers(-3, 0).map(str),
        st.sampled_from([str(2**31 - 1), str(2**31), str(10**20), "1.5", "abc", "١", "%00"]),
        st.sampled_from(world.variant_ids).map(str),
    )
    if converter == "id":
        return ids
    if converter == "work":
        return st.one_of(ids, ids.map(lambda v: "cmd-" + v))
    refs = [world.ann_order["reference"], world.bob_order["reference"]]
    return st.one_of(
        st.sampled_from(refs),
        st.sampled_from(refs),
        st.sampled_from(refs).map(str.lower),
        texts,
        st.integers(1, 300).map(lambda n: "A" * n),
        st.sampled_from(["BK-UNKNOWN", "cmd-1"]),
    )


def _form_values(world: World):
    return st.one_of(
        numbers.map(str),
        texts,
        st.sampled_from(
            [
                "0",
                "-1",
                "99",
                "100",
                str(2**31),
                "1.5",
                "1e3",
                "fixed",
                "retry",
                "delivery:x",
                "command:send_email",
                "delivery:send_order_confirmation",
                "/console/",
                "//evil.example",
                "/console/\r\nX: 1",
                "ann@example.com",
                "a@b",
                "not-an-email",
            ]
        ),
        st.sampled_from(world.variant_ids).map(str),
        st.integers(1, 3).map(str),  # versions the orders really have
        st.sampled_from([300, 2_001, 5_000, 200_000, 1_100_000]).map(lambda n: "x" * n),  # long; over the limit
    )


# What a well-meaning client would put in each route's form, so that generated inputs also get
# past validation and reach the actions (a route without hints gets only generated fields).
def _hints(world: World) -> dict:
    return {
        "storefront.add_to_cart": {
            "variant_id": st.sampled_from(world.variant_ids).map(str),
            "quantity": st.integers(1, 3).map(str),
        },
        "storefront.set_quantity": {"quantity": st.integers(1, 5).map(str)},
        "storefront.checkout": {"email": st.just("someone@example.com")},
        "storefront.cancel": {"version": st.integers(1, 4).map(str)},
        "console.login": {"email": st.just("night-shift@example.com"), "password": st.just("wrong")},
        "console.discard_work": {"reason": st.just("duplicate of a manual fix")},
        "console.resolve_warning": {"action": st.sampled_from(["fixed", "retry"]), "note": st.just("by hand")},
        "console.retry_all_dead": {
            "what": st.sampled_from(
                ["delivery:send_order_confirmation", "command:send_email", "command:refund_payment"]
            )
        },
    }


@st.composite
def requests_(draw, world: World):
    rule = draw(st.sampled_from(world.post_rules), label="rule")
    path = rule.rule
    for match in reversed(list(_ARG.finditer(rule.rule))):
        value = draw(_path_values(world, match.group(1) or "default"), label=match.group(2))
        path = path[: match.start()] + quote(value.encode("utf-8", "surrogatepass"), safe="") + path[match.end() :]
    console = rule.endpoint.startswith("console.")
    who = draw(
        st.sampled_from(
            ["operator"] * 6 + ["ann", "nobody"] if console else ["ann"] * 3 + ["bob"] * 3 + ["operator", "nobody"]
        ),
        label="client",
    )
    csrf = draw(
        st.sampled_from(["form"] * 5 + ["header"] * 2 + ["missing", "garbage", "other browser's"]), label="csrf"
    )
    body_kind = draw(st.sampled_from(["form"] * 5 + ["json"] * 3 + ["json_any", "deep", "bytes", "none"]), label="body")
    fields = []
    for name, valid in _hints(world).get(rule.endpoint, {}).items():
        choice = draw(st.sampled_from(["valid"] * 3 + ["hostile", "missing"]))
        if choice != "missing":
            fields.append((name, draw(valid if choice == "valid" else _form_values(world))))
    fields += draw(
        st.lists(st.tuples(st.sampled_from(FIELD_NAMES), _form_values(world)), max_size=3), label="more fields"
    )
    query = draw(
        st.lists(st.tuples(st.sampled_from(["token", "next", "page", "status"]), _form_values(world)), max_size=2),
        label="query",
    )
    if query:
        path += "?" + urlencode([(k, v.encode("utf-8", "surrogatepass")) for k, v in query])
    accept = draw(st.sampled_from([JSON, {"Accept": "text/html"}]), label="accept")
    content = None
    if body_kind == "json":
        as_json = {}
        for name, value in fields:
            number = int(value) if value.lstrip("-").isdigit() and len(value) < 50 else value
            # JSON can carry what a form cannot: numbers, nulls, nesting, and lone surrogates.
            as_json[name] = draw(st.sampled_from([value, number, value + "\ud800"]) | texts | json_values)
        content = ("application/json", json.dumps(as_json).encode())
    elif body_kind == "json_any":
        content = ("application/json", json.dumps(draw(json_values)).encode())
    elif body_kind == "deep":
        content = ("application/json", draw(deep_json).encode())
    elif body_kind == "bytes":
        content = (
            draw(
                st.sampled_from(
                    [
                        "application/x-www-form-urlencoded",
                        "multipart/form-data",
                        "multipart/form-data; boundary=x",
                        "application/json",
                        "text/plain",
                        "application/json; charset=latin-1",
                        "",
                        "x/y",
                    ]
                )
            ),
            draw(st.binary(max_size=200)),
        )
    return rule, path, who, csrf, body_kind, fields, content, accept


def _send(world: World, request):
    rule, path, who, csrf, body_kind, fields, content, accept = request
    clients = {
        "ann": (world.ann.client, world.ann.token),
        "bob": (world.bob.client, world.bob.token),
        "operator": (world.operator, world.operator_token),
    }
    if who == "nobody":
        client, token = world.app.test_client(), None
    else:
        client, token = clients[who]
    if who == "operator":
        with client.session_transaction() as session:
            logged_in = "_user_id" in session
        if not logged_in:  # an earlier input logged it out
            world.operator_token = token = log_in_again(world)
    headers = dict(accept)
    sent_token = {
        "form": token,
        "header": token,
        "missing": None,
        "garbage": "x" * 20,
        "other browser's": world.bob.token if who != "bob" else world.ann.token,
    }[csrf]
    pairs = [(k, v.encode("utf-8", "surrogatepass")) for k, v in fields]
    as_field = csrf != "header" and body_kind == "form"
    if sent_token is not None and as_field:
        pairs.insert(0, ("csrf_token", sent_token.encode()))
    if sent_token is not None and not as_field:
        headers["X-CSRFToken"] = sent_token
    if content is None and body_kind == "form":
        content = ("application/x-www-form-urlencoded", urlencode(pairs).encode())
    if content is None:
        return client.post(path, headers=headers)
    if content[0]:
        headers["Content-Type"] = content[0]
    return client.post(path, data=content[1], headers=headers)


def log_in_again(world: World) -> str:
    from support import log_in_again as again

    return again(world.operator)


def test_every_post_route_with_generated_forms_and_json(make_fresh_app, sandbox, tally):
    world = _world(make_fresh_app, sandbox)
    world.post_rules = _post_rules(world.app)
    ann_ref = world.ann_order["reference"]
    ann_secrets = [world.ann_access_token, "ann@example.com"]

    @_settings("post_routes")
    @given(requests_(world))
    def send(request):
        rule, path, who, *_ = request
        shown = [x if not isinstance(x, (bytes, str)) or len(x) < 400 else f"<{len(x)} long>" for x in request[3:]]
        note(f"{rule.endpoint} POST {path} as {who}: {shown}")
        before = _snapshot(world.app)
        r = _send(world, request)
        tally["inputs"] += 1
        answer = r.get_data(as_text=True)
        said = (r.get_json(silent=True) or {}).get("error", "") if r.status_code == 400 else ""
        tally["answers"][(rule.endpoint, r.status_code, said[:40])] += 1
        assert r.status_code < 500, answer[:800]
        after = _snapshot(world.app)
        if r.status_code >= 400:
            changed = _changed(before, after)
            assert not changed, f"a refused input ({r.status_code}) changed {changed}: {answer[:300]}"
        audited = _new_audit_rows(before, after)
        assert len(audited) <= 1 and all(a["status"] == r.status_code for a in audited), audited
        if audited:
            assert who == "operator" and rule.endpoint.startswith("console."), audited
        if rule.endpoint.startswith("storefront.") and who != "ann" and path.startswith(f"/orders/{ann_ref}/"):
            assert r.status_code in (400, 404, 413), f"another browser acted on ann's order: {r.status_code}"
            assert not any(s in answer for s in ann_secrets), "another browser was shown ann's order"

    send()
