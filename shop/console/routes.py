"""Console pages (docs/REFERENCE.md, Console); the operator actions are outbox_actions.py,
refund_actions.py and order_actions.py.

Every page answers JSON too (same URL, `Accept: application/json`). Every action is a POST,
checked for CSRF by CSRFProtect before the view runs, and goes through the same use case the
rest of the shop uses: the reconcile button is the sweep's `reconcile_order`, a retried dead
letter is the outbox's `dispatch.retry_dead`, a retried restore is the saga's own handler
(`saga.warnings`). Routes read what they answer with; every write is a use case's.
"""

from __future__ import annotations

import re

from flask import request, url_for

from ..connections import reads_only
from ..domain.deadlines import utcnow
from ..domain.order import OrderStatus
from ..web.answers import respond
from . import acks, audit, auth, board, charts, export, outbox_queries, overview, queries, timeline  # noqa: F401  (auth registers the login routes)
from .answers import of_order, page_number, problem
from .blueprint import bp
from .format import human_age, human_money
from .forms import ActionForm, DiscardForm
from .search import read_filters, refused
from .words import TEMPLATE_WORDS

bp.after_request(audit.record_action)


@bp.context_processor
def _helpers():
    # formdata=None: a button's form needs only its CSRF token, and reading the request here
    # would fail again inside the error page of a request that failed for its body (a 413).
    # The words of shop/console/words.py: the pages say them, the JSON keeps the codes.
    return {"age": human_age, "money": human_money, "action_form": ActionForm(formdata=None), **TEMPLATE_WORDS}


def not_one_of(choices, what: str, value: str, page: str):
    """The 400 of a list's filter given a value outside its `choices`: says which there are, with
    a way back to the list (the endpoint `page`) unfiltered."""
    return problem(400, f"Unknown {what} {value!r}; use one of {', '.join(choices)}.", back=url_for(page))


# -- pages -----------------------------------------------------------------------------------


@bp.get("/")
@reads_only
def dashboard():
    """Counts and oldest ages of what needs a human: stuck orders, dead letters, open restore
    warnings, and when the reconciliation sweep last ran; every process with its heartbeat's
    age, every queue with its depth, and the next sweep."""
    now = utcnow()
    data = {**overview.dashboard(now), **overview.liveness(now)}
    data["cards"] = board.cards(data, now)
    data["summary"] = acks.apply(data["cards"], now)  # red first; one line: how many need a human
    waiting = next(c for c in data["cards"] if c["key"] == "waiting")
    data["charts"] = charts.charts(now, waiting["oldest_seconds"])
    return respond("console/dashboard.html", data, svg=charts.svg)


@bp.get("/orders")
def orders():
    """Orders, newest first; `stuck=1` keeps live orders unchanged for longer than the stuck age
    (longest waiting first); `status=` (repeatable) filters by state; `q` finds an order by
    part of a reference or customer email (any case), or a provider session id; `from`/`to` the
    days placed, `amount`/`amount_min`/`amount_max` the total; `format=csv` downloads every match."""
    statuses = [s for s in request.args.getlist("status") if s]
    known = set(OrderStatus)
    unknown = [s for s in statuses if s not in known]
    if unknown:
        return not_one_of(sorted(known), "order status", unknown[0], "console.orders")
    stuck = request.args.get("stuck", "") in ("1", "true", "yes", "on")
    filters = read_filters(request.args, amounts=True)
    if not filters.ok:
        empty = {"orders": [], "filters": {"stuck": stuck, "status": statuses}}
        return refused(filters, "console/orders.html", empty, statuses=sorted(known))
    if export.wants_csv(request.args):
        return export.orders_csv(utcnow(), stuck=stuck, statuses=statuses, filters=filters)
    data = queries.orders(utcnow(), stuck=stuck, statuses=statuses, page=page_number(), filters=filters)
    return respond("console/orders.html", data, statuses=sorted(known))


@bp.get("/audit")
def audit_trail():
    """Every operator action, newest first: who, when, what, the reason and how it went;
    `operator=` keeps one operator's; `q`, `from`, `to` search it and `format=csv` downloads it."""
    operator = (request.args.get("operator") or "").strip()[:254]
    filters = read_filters(request.args)
    if not filters.ok:
        return refused(filters, "console/audit.html", {"actions": [], "filters": {"operator": operator}})
    if export.wants_csv(request.args):
        return export.audit_csv(utcnow(), operator=operator, filters=filters)
    return respond("console/audit.html", queries.audit(page=page_number(), operator=operator, filters=filters))


@bp.get("/orders/<reference>")
@of_order
def order_detail(order):
    """One order's timeline: transitions, webhooks, deliveries, deadlines, warnings, refunds."""
    data, shown = timeline.order_page(order, utcnow())
    return respond("console/order.html", data, **shown)


@bp.get("/outbox")
def outbox():
    """Deliveries of events to handlers, and scheduled commands; `status=dead` for dead letters,
    `status=waiting` for pending work waiting for an unavailable provider."""
    status = request.args.get("status") or None
    if status is not None and status not in outbox_queries.WORK_FILTERS:
        return not_one_of(outbox_queries.WORK_FILTERS, "status", status, "console.outbox")
    keep = re.fullmatch(r"(cmd-)?([1-9][0-9]{0,9})", request.args.get("keep") or "")
    keep = ("command" if keep.group(1) else "delivery", int(keep.group(2))) if keep else None
    filters = read_filters(request.args)
    context = {"statuses": outbox_queries.WORK_FILTERS, "discard_form": DiscardForm()}
    if not filters.ok:
        empty = {"status": status, "deliveries": [], "kept": None}
        return refused(filters, "console/outbox.html", empty, details=[], commands=[], dead_groups=[], **context)
    if export.wants_csv(request.args):
        if request.args.get("kind") == "commands":
            return export.commands_csv(utcnow(), status=status, filters=filters)
        return export.deliveries_csv(utcnow(), status=status, filters=filters)
    data, details, commands = outbox_queries.outbox(
        utcnow(), status=status, page=page_number(), keep=keep, filters=filters
    )
    return respond(
        "console/outbox.html",
        data,
        details=details,
        commands=commands,
        dead_groups=outbox_queries.dead_groups(),
        **context,
    )


@bp.get("/restore-warnings")
def restore_warnings():
    """Stock a compensation could not give back; `state=open` for those awaiting an operator;
    `q`, `from`, `to` search them and `format=csv` downloads them."""
    state = request.args.get("state") or None
    if state is not None and state not in queries.WARNING_STATES:
        return not_one_of(queries.WARNING_STATES, "state", state, "console.restore_warnings")
    filters = read_filters(request.args)
    if not filters.ok:
        empty = {"state": state, "warnings": []}
        return refused(filters, "console/restore_warnings.html", empty, details=[], states=queries.WARNING_STATES)
    if export.wants_csv(request.args):
        return export.warnings_csv(utcnow(), state=state, filters=filters)
    data, details = queries.restore_warnings(utcnow(), state=state, page=page_number(), filters=filters)
    return respond("console/restore_warnings.html", data, details=details, states=queries.WARNING_STATES)


@bp.get("/webhooks")
def webhooks():
    """Every webhook delivery received, accepted or rejected, with the reason and the address it
    came from, newest first; `signed=no` keeps the noise (not signed with the shop's secret)."""
    outcome = request.args.get("outcome") or None
    if outcome is not None and outcome not in queries.WEBHOOK_OUTCOMES:
        return not_one_of(queries.WEBHOOK_OUTCOMES, "outcome", outcome, "console.webhooks")
    signed = {"yes": True, "no": False, "": None}.get(request.args.get("signed") or "", "bad")
    if signed == "bad":
        return problem(
            400, "signed= is yes (the provider's deliveries) or no (the noise).", back=url_for("console.webhooks")
        )
    filters = read_filters(request.args)
    if not filters.ok:
        return refused(
            filters, "console/webhooks.html", {"outcome": outcome, "webhooks": [], "counts": {}, "signed": signed}
        )
    if export.wants_csv(request.args):
        return export.webhooks_csv(utcnow(), outcome=outcome, filters=filters, signed=signed)
    return respond(
        "console/webhooks.html", queries.webhooks(outcome=outcome, page=page_number(), filters=filters, signed=signed)
    )


@bp.get("/refunds")
def refunds():
    """Refunds of late money, oldest first; `status=failed` keeps those whose money did not go
    back and that no operator has dealt with (the dashboard's Failed refunds)."""
    status = request.args.get("status") or None
    if status is not None and status not in queries.REFUND_FILTERS:
        return not_one_of(queries.REFUND_FILTERS, "status", status, "console.refunds")
    filters = read_filters(request.args, amounts=True)
    if not filters.ok:
        empty = {"status": status, "refunds": []}
        return refused(filters, "console/refunds.html", empty, statuses=queries.REFUND_FILTERS)
    if export.wants_csv(request.args):
        return export.refunds_csv(utcnow(), status=status, filters=filters)
    return respond(
        "console/refunds.html",
        queries.refunds(utcnow(), status=status, page=page_number(), filters=filters),
        statuses=queries.REFUND_FILTERS,
    )


@bp.get("/sweeps")
def sweeps():
    """Reconciliation cycles with what each pass did, newest first."""
    return respond("console/sweeps.html", queries.sweeps(utcnow(), page=page_number()), outcome_words=SWEEP_WORDS)


SWEEP_WORDS = {
    "lost_race": "lost races (someone else moved the order first)",
    "changed": "changed meanwhile",
    "open": "still open at the provider",
    "awaiting_async": "awaiting an async payment",
    "unavailable": "provider unreachable",
    "held_back": "not asked (the provider's rate budget was spent)",
    "cancelled": "cancelled",
    "payment_failed": "payment failed",
    "proof_refused": "payment proof refused",
    "refund_created": "refunds queued",
    "errors": "not settled (see the problems)",
    "woken": "rows that waited for the provider run now (it answers again)",
}
