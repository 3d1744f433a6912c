"""The held journey of bench/chaos.py (`--capture dispatch`, docs/REFERENCE.md, CAPTURE_MODE): card
payments held at checkout (the order Authorized), some shipped by an operator (the capture), some
shipped late, racing the hold's own deadline, some cancelled by their customer or an operator
(the void), one cancel racing a ship, and some left for the hold's deadline to void and cancel
(or, when the faults make that late, for the hold to lapse at the sandbox: its
`authorization_validity_seconds` is set short for the run). Then, from the sandbox's objects and
the shop's JSON, the guarantees of a hold: captured at most once, voided (never refunded) when
its order was cancelled, every shipped order's hold captured, none left held or Authorized.

Imported by bench/chaos.py (run as a script, so its folder is on the path); it takes the run and
its browsers as chaos.py made them."""

from __future__ import annotations

import collections
import threading
import time

import requests

# kind: weight, mixed into chaos.py's journeys with --capture dispatch.
HELD_JOURNEYS = {
    "held_ship": 40,
    "held_ship_late": 8,
    "held_cancel": 10,
    "held_operator_cancel": 8,
    "held_cancel_racing_ship": 8,
    "held_lapse": 8,
}
# The shop's AUTHORIZATION_MARGIN_SECONDS for the run (its minimum) and the warning above it.
MARGIN_SECONDS = 60
WARNING_SECONDS = 120


def shop_settings(hold_seconds: int) -> dict:
    """The shop's environment for a held run."""
    assert hold_seconds > MARGIN_SECONDS, "the hold must outlast the margin its deadline fires before"
    return {
        "CAPTURE_MODE": "dispatch",
        "AUTHORIZATION_MARGIN_SECONDS": str(MARGIN_SECONDS),
        "AUTHORIZATION_WARNING_SECONDS": str(WARNING_SECONDS),
    }


def hold_for(sandbox: str, hold_seconds: int) -> None:
    """Card holds at the sandbox lapse after `hold_seconds` (its account setting)."""
    r = requests.post(f"{sandbox}/_sandbox/account", json={"authorization_validity_seconds": hold_seconds}, timeout=30)
    r.raise_for_status()


def held_steps(run, b, operator, kind: str, rng, ref: str, sid: str) -> None:
    """One held journey for order `ref` at its session `sid`: `b` the customer's browser,
    `operator` a logged-in console browser."""
    r = run.outcome(sid, "paid")  # a card payment: held, not taken
    if r is None or r.status_code != 200:
        run.stats.note(f"{kind}:not_held_{getattr(r, 'status_code', 'no_answer')}")
        return
    b.request("GET", f"/checkout/return?order={ref}&session_id={sid}")  # back from the page: the hold applied
    data = authorized(b, ref, 20)
    status = data["status"] if data else "unreadable"
    if status != "Authorized":
        run.stats.note(f"{kind}:{status}")
        return
    if kind == "held_lapse":
        run.stats.note(f"{kind}:left")  # the hold's deadline voids and cancels it, or the hold lapses
        return
    if kind == "held_ship_late":
        # Shipped about when the hold's deadline fires (a margin before the hold lapses): one wins.
        time.sleep(max(0.0, run.args.hold_seconds - MARGIN_SECONDS + rng.uniform(-3, 3)))
    if kind in ("held_ship", "held_ship_late"):
        run.stats.note(f"{kind}:ship_{ship(operator, ref, rng)}")
    elif kind == "held_cancel":
        run.stats.note(f"{kind}:cancel_{cancel(b, ref, data['version'])}")
    elif kind == "held_operator_cancel":
        r = operator.post_form(f"/console/orders/{ref}/cancel", {"reason": "chaos: the operator cancels"})
        run.stats.note(f"{kind}:cancel_{getattr(r, 'status_code', 'no_answer')}")
    elif kind == "held_cancel_racing_ship":
        race(run, b, operator, rng, ref, data["version"])


def authorized(b, ref: str, timeout: float) -> dict | None:
    """The order once it left PaymentInitiated (a journey under way finishes even as the run
    stops: its hold is what the checks are about), or as it is after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        data = b.order(ref)
        if (data is not None and data["status"] != "PaymentInitiated") or time.monotonic() > deadline:
            return data
        time.sleep(0.5)


def ship(operator, ref: str, rng) -> str:
    r = operator.post_form(f"/console/orders/{ref}/ship", {"tracking": f"CHAOS{rng.randrange(10**6):06d}"})
    if r is None:
        return "no_answer"
    if r.status_code == 200 and r.json().get("capturing"):
        return "capturing"
    return str(r.status_code)


def cancel(b, ref: str, version: int) -> str:
    r = b.cancel(ref, version)
    return str(getattr(r, "status_code", "no_answer"))


def race(run, b, operator, rng, ref: str, version: int) -> None:
    """The customer's cancel and the operator's ship at once: one of them wins, never both."""
    barrier = threading.Barrier(2)
    result = {}

    def shipper():
        barrier.wait()
        time.sleep(rng.uniform(0, 0.2))
        result["ship"] = ship(operator, ref, rng)

    thread = threading.Thread(target=shipper, daemon=True)
    thread.start()
    barrier.wait()
    time.sleep(rng.uniform(0, 0.2))
    said = cancel(b, ref, version)
    thread.join(60)
    run.stats.note(f"held_cancel_racing_ship:cancel_{said}_ship_{result.get('ship')}")


# Checks -----------------------------------------------------------------------------------------


def _was_held(intent: dict, captures: int) -> bool:
    """A payment the sandbox held for a later capture: asked to (the card's capture_method), and
    captured, still held or ended uncaptured (an asynchronous method was taken at once)."""
    card = (intent.get("payment_method_options") or {}).get("card") or {}
    manual = "manual" in (intent.get("capture_method"), card.get("capture_method"))
    return manual and (captures > 0 or intent["status"] in ("requires_capture", "canceled"))


def check_holds(run, checks, orders: dict) -> None:
    """The guarantees of a hold (docs/REFERENCE.md, Guarantees), from the sandbox's objects and
    events and the orders' JSON (`orders`: reference -> the console's order)."""
    events = requests.get(f"{run.sandbox}/_sandbox/events", timeout=60).json()["data"]
    captures = collections.Counter(
        e["event"]["data"]["object"].get("payment_intent") for e in events if e["event"]["type"] == "charge.captured"
    )
    refunds = collections.Counter(rf["payment_intent"] for rf in run.v1_list("/v1/refunds"))
    held = {}  # payment intent id -> (order reference, the intent), for card payments that were held
    for s in run.v1_list("/v1/checkout/sessions", **{"expand[]": "data.payment_intent"}):
        intent = s.get("payment_intent")
        if isinstance(intent, dict) and _was_held(intent, captures[intent["id"]]):
            held[intent["id"]] = (s["client_reference_id"], intent)
    twice = [ref for pi, (ref, _) in held.items() if captures[pi] > 1]
    checks.add(
        "each hold captured at most once (charge.captured at the sandbox)",
        not twice,
        f"{len(held)} held payments, {sum(1 for pi in held if captures[pi])} captured, {len(twice)} more than once",
        twice,
    )
    still_held = [ref for ref, intent in held.values() if intent["status"] == "requires_capture"]
    cancelled = [(ref, pi, i) for pi, (ref, i) in held.items() if (orders.get(ref) or {}).get("status") == "Cancelled"]
    ended = sum(1 for _, _, intent in cancelled if intent["status"] == "canceled")
    taken = [ref for ref, pi, intent in cancelled if captures[pi] or intent["status"] == "succeeded"]
    refunded = [ref for ref, pi, _ in cancelled if refunds[pi]]
    checks.add(
        "a cancelled order's hold is voided or lapsed, never captured or refunded",
        not (refunded or taken),
        f"{len(cancelled)} cancelled orders with a hold: {ended} voided or lapsed, {len(taken)} captured, "
        f"{len(refunded)} refunded",
        refunded + taken,
    )
    checks.add("no hold left held at the end", not still_held, f"{len(still_held)} still requires_capture", still_held)
    by_ref = {ref: (pi, intent) for pi, (ref, intent) in held.items()}
    shipped = [ref for ref, o in orders.items() if (o.get("fulfilment") or {}).get("status") == "shipped"]
    uncaptured = [
        ref
        for ref in shipped
        if ref in by_ref
        and (by_ref[ref][1]["status"] != "succeeded" or by_ref[ref][1].get("amount_received") != orders[ref]["charged"])
    ]
    paid_unshipped = [
        ref
        for ref, o in orders.items()
        if ref in by_ref and o["status"] == "Paid" and o["payment"]["session_id"] and ref not in shipped
    ]
    checks.add(
        "every shipped order's hold captured in full; every held order Paid only through its ship",
        not (uncaptured or paid_unshipped),
        f"{len(shipped)} shipped, {len(uncaptured)} not captured in full, {len(paid_unshipped)} Paid unshipped",
        uncaptured + paid_unshipped,
    )
    authorized = [ref for ref, o in orders.items() if o["status"] == "Authorized"]
    checks.add("no order left Authorized", not authorized, f"{len(authorized)} Authorized at the end", authorized)
