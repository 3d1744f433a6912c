"""Log lines (docs/REFERENCE.md, Logs): LOG_FORMAT=json writes one JSON object per line with the
node and whichever of the context's fields are known; every request has an id (an incoming
X-Request-ID kept), the deliveries and commands a request's commit wrote carry it, and the
worker's lines for them (and for what they write in turn) carry it too; every provider call is
one line. The lines are read as the process's handler formats them (shop.logs.handler)."""

from __future__ import annotations

import io
import json
import logging
import re
import signal
import time
import uuid
from datetime import datetime

import pytest
from sqlalchemy import select

from payment_helpers import HTML, Shopper
from shop import logs, node, queue
from shop.extensions import db
from shop.models import Order, OutboxDelivery, ScheduledCommand
from shop.web.request_ids import request_id_of


class Lines:
    """What a handler of LOG_FORMAT wrote while it was attached to the root logger, at INFO."""

    def __init__(self, log_format: str):
        self.stream = io.StringIO()
        self.handler = logs.handler(log_format, self.stream)

    def text(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def json(self) -> list[dict]:
        return [json.loads(line) for line in self.text()]


@pytest.fixture
def captured():
    """Attach a handler of each format asked for: `captured("json")` returns its Lines."""
    node.add_node_to_log_records()
    root = logging.getLogger()
    level = root.level
    attached: list[Lines] = []

    def attach(log_format: str = "json") -> Lines:
        lines = Lines(log_format)
        root.addHandler(lines.handler)
        attached.append(lines)
        return lines

    root.setLevel(logging.INFO)
    yield attach
    for lines in attached:
        root.removeHandler(lines.handler)
    root.setLevel(level)


def _utc(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text[:-1] + "+00:00")


# -- the lines themselves -----------------------------------------------------------------------


def test_a_json_line_is_one_object_with_time_level_logger_message_node_and_what_is_known(captured):
    lines = captured("json")
    with logs.scope(request_id="req-1", order_ref="BK-TEST1", order_id=None):
        logging.getLogger("shop.test").warning("paid %s of %s", 3, "mugs")
    logging.getLogger("shop.test").info("outside any scope")
    try:
        raise ValueError("broken")
    except ValueError:
        logging.getLogger("shop.test").exception("it failed")

    inside, outside, failed = lines.json()
    assert set(inside) == {"time", "level", "logger", "message", "node", "request_id", "order_ref"}
    assert inside["level"] == "WARNING" and inside["logger"] == "shop.test" and inside["message"] == "paid 3 of mugs"
    assert inside["node"] == node.node_name()
    assert inside["request_id"] == "req-1" and inside["order_ref"] == "BK-TEST1"
    assert abs((_utc(inside["time"]) - datetime.now(_utc(inside["time"]).tzinfo)).total_seconds()) < 60
    assert set(outside) == {"time", "level", "logger", "message", "node"}  # nothing leaks out of the scope
    assert failed["level"] == "ERROR" and "ValueError: broken" in failed["exc_info"]


def test_the_text_format_keeps_its_one_line_shape(captured):
    lines = captured("text")
    with logs.scope(request_id="req-2"):
        logging.getLogger("shop.test").warning("still %s", "text")
    (line,) = lines.text()
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    pattern = rf"{when} WARNING \[{re.escape(node.node_name())}\] shop.test still text"
    assert re.fullmatch(pattern, line), line


def test_a_field_learned_inside_a_scope_ends_with_it_and_nothing_is_learned_outside_one(captured):
    lines = captured("json")
    logs.learn(order_ref="BK-NOWHERE")  # no scope: a long-lived thread must not keep it
    with logs.scope(job_id="job-1"):
        with logs.scope(command_id=7):
            logs.learn(order_ref="BK-LEARNED")
            logging.getLogger("shop.test").info("in the row")
        logging.getLogger("shop.test").info("after the row")
    logging.getLogger("shop.test").info("after the job")
    row, job, after = lines.json()
    assert (row["job_id"], row["command_id"], row["order_ref"]) == ("job-1", 7, "BK-LEARNED")
    assert job["job_id"] == "job-1" and "command_id" not in job and "order_ref" not in job
    assert "job_id" not in after and "order_ref" not in after


def test_configure_installs_one_handler_switches_its_format_and_leaves_a_configured_root_alone():
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        root.handlers = [h for h in saved if getattr(h, "backstop", False)]
        for ours in root.handlers:
            root.removeHandler(ours)
        logs.configure("json")
        (ours,) = root.handlers
        assert ours.backstop and root.level == logging.INFO
        assert type(ours.formatter).__name__ == "JsonFormatter"
        logs.configure("text")
        assert root.handlers == [ours] and type(ours.formatter).__name__ == "_OneLine"

        other = logging.NullHandler()
        root.handlers = [other]
        logs.configure("json")
        assert root.handlers == [other]  # someone else's logging (a host's, a test runner's)
    finally:
        root.handlers = saved
        root.setLevel(level)


def test_a_clients_newline_or_escape_in_a_message_forges_no_line_in_either_format(captured):
    text, as_json = captured("text"), captured("json")
    logging.getLogger("shop.webhooks").warning("refused %s", "evt_1\n[node] CRITICAL forged\x1b[2J")
    (line,) = text.text()
    assert "evt_1\\x0a[node] CRITICAL forged\\x1b[2J" in line
    (record,) = as_json.json()
    assert record["message"] == "refused evt_1\n[node] CRITICAL forged\x1b[2J"  # JSON escapes it itself


# -- the request id ---------------------------------------------------------------------------


def test_a_client_chosen_request_id_that_could_forge_a_log_line_or_markup_is_replaced(fresh_client):
    for forged in ('a" 200 "b', "<script>x</script>", "id\x1b[31mred", "a%0aforged", "back\\slash", "semi;colon"):
        answer = fresh_client.get("/cart", headers={"X-Request-ID": forged})
        assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["X-Request-ID"]), forged
    # What a header cannot carry through a test client, the rule refuses as well.
    for forged in ("a\nforged line", "a\rb", "nul\x00"):
        assert request_id_of(forged) != forged
    assert request_id_of("lb-7f3a9c/2:1.x+y=z@n_") == "lb-7f3a9c/2:1.x+y=z@n_"


def test_an_incoming_request_id_is_kept_and_echoed_and_otherwise_one_is_made(fresh_client):
    kept = fresh_client.get("/cart", headers={"X-Request-ID": "lb-7f3a9c/2"})
    assert kept.headers["X-Request-ID"] == "lb-7f3a9c/2"
    made = [fresh_client.get("/cart").headers["X-Request-ID"] for _ in range(2)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", m) for m in made) and made[0] != made[1]
    # Not kept: what the column cannot hold whole, or what is not one printable word.
    for bad in ("x" * 65, "two words", "caf\u00e9"):
        answer = fresh_client.get("/cart", headers={"X-Request-ID": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["X-Request-ID"]), bad
    # An error's answer carries it too.
    missing = fresh_client.get("/no-such-page", headers={"X-Request-ID": "lost-1"})
    assert missing.status_code == 404 and missing.headers["X-Request-ID"] == "lost-1"


def _checkout(shopper: Shopper, request_id: str) -> str:
    assert shopper.add().status_code == 303
    placed = shopper.post("/checkout", headers={**HTML, "X-Request-ID": request_id}, email=shopper.email)
    assert placed.status_code == 303, placed.get_data(as_text=True)
    assert placed.headers["X-Request-ID"] == request_id
    with shopper.app.app_context():
        ref = db.session.execute(select(Order.reference).order_by(Order.id.desc())).scalars().first()
        db.session.remove()
    return ref


def _run_worker_burst(app) -> None:
    """A real worker of this app, in this process, until its queues are empty (RQ's signal
    handlers put back afterwards)."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with app.app_context():
            worker = queue.make_worker(name=f"test-logs-{uuid.uuid4().hex[:8]}")
            worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
            db.session.remove()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_a_checkouts_request_id_is_on_its_lines_and_on_the_workers_lines_for_the_work_it_left(
    make_shop, captured, fake_clock
):
    """The provider is unreachable: the checkout places the order without a payment page, and
    its deadline (the short hold, 1 s here) cancels it; the cancel's deliveries give the stock
    back and write the email. One filter on the checkout's request id finds the web's line, the
    deadline's and the deliveries', each naming its job, its row and the order."""
    shop = make_shop(UNPAID_HOLD_WITHOUT_SESSION_SECONDS=1, CLOCK=fake_clock)
    lines = captured("json")
    request_id = f"checkout-{uuid.uuid4().hex[:8]}"
    ref = _checkout(Shopper(shop), request_id)

    web = [line for line in lines.json() if line.get("request_id") == request_id]
    calls = [line for line in web if line["logger"] == "shop.provider"]  # each attempt: the SDK retries once
    assert calls and all(c["endpoint"] == "POST /v1/checkout/sessions" for c in calls)
    assert all(c["outcome"] == "unreachable" and c["order_ref"] == ref and "job_id" not in c for c in calls)

    with shop.app_context():
        order_id = db.session.execute(select(Order.id).where(Order.reference == ref)).scalar_one()
        # Its deadline (beside it, the payment-link email's command, which waits for the provider).
        deadline = db.session.execute(
            select(ScheduledCommand).where(
                ScheduledCommand.order_id == order_id, ScheduledCommand.kind == "expire_unpaid_order"
            )
        ).scalar_one()
        assert deadline.kind == "expire_unpaid_order" and deadline.request_id == request_id
        db.session.remove()

    fake_clock.advance(1.2)  # the hold runs out
    with shop.app_context():
        queue.request_drain(kind=queue.Drain.COMMANDS)
    _run_worker_burst(shop)  # runs the deadline; its commit wakes a delivery drain, run too

    with shop.app_context():
        deliveries = db.session.execute(select(OutboxDelivery).where(OutboxDelivery.order_id == order_id)).scalars()
        written = {d.handler: (d.status, d.request_id) for d in deliveries}
        db.session.remove()
    assert written == {
        "send_order_placed_email": ("done", request_id),  # written by the checkout itself
        "restore_inventory": ("done", request_id),
        "send_cancellation_email": ("done", request_id),
    }

    ours = [line for line in lines.json() if line.get("request_id") == request_id]
    (expired,) = [line for line in ours if "payment window expired" in line["message"]]
    assert expired["command_id"] == deadline.id and expired["order_ref"] == ref and expired["order_id"] == order_id
    (restored,) = [line for line in ours if line["message"].startswith("restore_inventory:")]
    assert restored["order_ref"] == ref and restored["order_id"] == order_id and "delivery_id" in restored
    assert "command_id" not in restored
    # Two RQ jobs: the command drain, then the delivery drain its commit woke.
    assert expired["job_id"] and restored["job_id"] and expired["job_id"] != restored["job_id"]
    assert all(line["order_ref"] == ref for line in ours)


# -- provider calls -----------------------------------------------------------------------------


def test_a_provider_call_is_one_line_with_endpoint_latency_outcome_and_the_providers_ids(make_shop, sandbox, captured):
    shop = make_shop(sandbox=True)
    lines = captured("json")
    before = time.time()
    ref = _checkout(Shopper(shop), "checkout-with-payment")
    elapsed_ms = (time.time() - before) * 1000  # the checkout's, around the call: in the same unit

    calls = [line for line in lines.json() if line["logger"] == "shop.provider"]
    assert len(calls) == 1, calls
    (call,) = calls
    assert call["endpoint"] == "POST /v1/checkout/sessions"
    assert call["outcome"] == "ok" and call["status"] == 200 and call["level"] == "INFO"
    assert isinstance(call["latency_ms"], float) and 0 < call["latency_ms"] <= elapsed_ms, (call, elapsed_ms)
    assert call["provider_request_id"].startswith("req_")
    assert call["request_id"] == "checkout-with-payment" and call["order_ref"] == ref
    assert call["message"].startswith("provider call POST /v1/checkout/sessions: ok 200 in ")
    # The idempotency key the line names is the one the provider received.
    received = [c["idempotency_key"] for c in sandbox.requests(since=before - 1, method="POST")]
    assert call["idempotency_key"] and received == [call["idempotency_key"]]
