"""The sandbox's state file (`--state-file`, used by `flask shop up`): what a restart keeps, and
a file it cannot read is set aside with a reason instead of stopping the sandbox."""

import json

from shop.stripe_sandbox.persist import StateFile, snapshot
from shop.stripe_sandbox.state import Sandbox

from .test_idempotency_and_refunds import session_params


def test_a_restarted_sandbox_has_the_sessions_payments_refunds_endpoints_events_and_keys_it_saved(
    client, sandbox, tmp_path
):
    client.v1.webhook_endpoints.create(params={"url": "http://127.0.0.1:9/hook", "enabled_events": ["*"]})
    paid = client.v1.checkout.sessions.create(params=session_params(), options={"idempotency_key": "order-1-a1"})
    intent = sandbox.set_outcome(paid.id, "paid")["payment_intent"]
    client.v1.refunds.create(params={"payment_intent": intent, "amount": 500})
    open_one = client.v1.checkout.sessions.create(params=session_params(reference="ORD-2"))
    sandbox.faults(duplicate_webhooks=True)
    path = tmp_path / "state.json"
    with sandbox.sandbox.lock:  # the webhook's delivery attempts go on meanwhile
        before = snapshot(sandbox.sandbox)
    path.write_text(json.dumps(before))

    restarted = Sandbox(60, start_threads=False)
    message = StateFile(restarted, str(path)).load()
    assert message.startswith("loaded 2 sessions, 1 events and 1 webhook endpoints")
    after = snapshot(restarted)
    for state in (before, after):
        state.pop("settlements")
        for delivery in (d for e in state["events"] for d in e["deliveries"]):
            delivery.pop("next_attempt_at")  # rescheduled from the restart's clock
    assert after == before
    assert restarted.dispatcher._heap, "the webhook still owed is delivered after the restart"
    assert restarted.get_session(open_one.id).status == "open" and open_one.id in restarted._open_sessions
    assert ("sk_test_sandbox", "order-1-a1") in restarted.idempotency
    assert restarted.faults.duplicate_webhooks is False  # faults are not kept
    restarted.close()


def test_an_unreadable_state_file_is_moved_aside_with_its_reason_and_the_sandbox_starts_empty(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"format": 1, "sessions": [')
    restarted = Sandbox(60, start_threads=False)
    message = StateFile(restarted, str(path)).load()

    assert "is not a state this sandbox can read" in message and "started empty" in message
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("state.json.unreadable-")]
    assert len(aside) == 1 and aside[0].read_text() == '{"format": 1, "sessions": ['
    assert not path.exists() and restarted.sessions == {}


def test_saving_replaces_the_file_whole_and_only_when_something_changed(client, sandbox, tmp_path):
    path = tmp_path / "state.json"
    state = StateFile(sandbox.sandbox, str(path))
    assert state.save() and not state.save()
    client.v1.checkout.sessions.create(params=session_params())
    assert state.save()
    assert len(json.loads(path.read_text())["sessions"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left behind
