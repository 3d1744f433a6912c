"""Console pages and operator actions (docs/REFERENCE.md, Console).

Every page answers JSON too (same URL, `Accept: application/json`). Every action is a POST,
checked for CSRF by CSRFProtect before the view runs, and goes through the same use case the
rest of the shop uses: the reconcile button is the sweep's `reconcile_order`, a retried dead
letter is the outbox's `dispatch.retry_dead`, a retried restore is the saga's own handler
(`saga.warnings`). Routes read what they answer with; every write is a use case's.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from flask import current_app, flash, jsonify, redirect, render_template, request, url_for
from flask_login import current_user

from ..domain.deadlines import utcnow
from ..extensions import db
from ..models import Order, Refund, RestoreWarning
from ..orders.lookup import order_by_reference
from ..orders.serialize import iso
from ..outbox import dispatch
from ..payments import gateway, refund_remedies as refund_cases
from ..payments.apply import reconcile_order
from ..saga import warnings
from ..web import respond, wants_json, work_ref
from . import audit, auth, board, bp, queries  # noqa: F401  (auth registers the login routes)
from .auth import safe_next
from .forms import ActionForm, DiscardForm, ResolveForm, RetryRefundForm, SettleRefundForm
from .format import human_age, human_money, human_time

log = logging.getLogger("shop.console")


bp.after_request(audit.record_action)


@bp.context_processor
def _helpers():
    # formdata=None: a button's form needs only its CSRF token, and reading the request here
    # would fail again inside the error page of a request that failed for its body (a 413).
    return {"age": human_age, "money": human_money, "when": human_time, "action_form": ActionForm(formdata=None)}


# -- small helpers ---------------------------------------------------------------------------


def _page() -> int:
    try:
        return max(1, min(int(request.args.get("page", 1)), 100_000))
    except ValueError:
        return 1


def problem(status: int, message: str, *, title: str = "Cannot do that", back: str | None = None, **extra):
    """An error in words: JSON `{"error", "status", ...}` or a console page with a way back."""
    db.session.rollback()
    audit.outcome(message)
    if wants_json():
        return jsonify({"error": message, "status": status, **extra}), status
    back = safe_next(request.form.get("next") or back, url_for("console.dashboard"))
    return render_template("console/problem.html", data={"error": message}, title=title, back=back), status


def done(message: str, payload: dict, default_url: str, category: str = "ok", keep=None):
    """An action went through: JSON with what changed, or back to the page the button was on.
    `keep`: the outbox row acted on, which the list back there keeps showing with its new state
    although it no longer matches the list's filter (a retried dead letter is not dead)."""
    audit.outcome(message)
    if wants_json():
        return jsonify({**payload, "message": message}), 200
    flash(message, category)
    target = safe_next(request.form.get("next"), default_url)
    if keep is not None:
        target = _keeping(target, keep)
    return redirect(target, 303)


def _keeping(url: str, ref) -> str:
    parts = urlsplit(url)
    if parts.path != url_for("console.outbox"):
        return url
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "keep"] + [("keep", str(ref))]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _operator() -> str:
    return getattr(current_user, "email", "?")


def _order_by_reference(reference: str) -> Order | None:
    return order_by_reference(reference.strip().upper())


# -- pages -----------------------------------------------------------------------------------


@bp.get("/")
def dashboard():
    """Counts and oldest ages of what needs a human: stuck orders, dead letters, open restore
    warnings, and when the reconciliation sweep last ran; every process with its heartbeat's
    age, every queue with its depth, and the next sweep."""
    now = utcnow()
    data = {**queries.dashboard(now), **queries.liveness(now)}
    data["cards"] = board.cards(data, now)
    data["charts"] = board.charts(now)
    return respond("console/dashboard.html", data, svg=board.svg)


@bp.get("/orders")
def orders():
    """Orders, newest first; `stuck=1` keeps live orders unchanged for longer than the stuck age
    (longest waiting first); `status=` (repeatable) filters by state; `q` finds an order by
    reference, customer email or provider session id."""
    statuses = [s for s in request.args.getlist("status") if s]
    known = {"PendingPayment", "PaymentInitiated", "PaymentFailed", "Paid", "Cancelled"}
    unknown = [s for s in statuses if s not in known]
    if unknown:
        return problem(
            400,
            f"Unknown order status {unknown[0]!r}; use one of {', '.join(sorted(known))}.",
            back=url_for("console.orders"),
        )
    stuck = request.args.get("stuck", "") in ("1", "true", "yes", "on")
    q = (request.args.get("q") or "").strip()[:254]
    data = queries.orders(utcnow(), stuck=stuck, statuses=statuses, page=_page(), q=q)
    return respond("console/orders.html", data, statuses=sorted(known))


@bp.get("/audit")
def audit_trail():
    """Every operator action, newest first: who, when, what, the reason and how it went;
    `operator=` keeps one operator's."""
    operator = (request.args.get("operator") or "").strip()[:254]
    return respond("console/audit.html", queries.audit(page=_page(), operator=operator))


@bp.get("/orders/<reference>")
def order_detail(reference):
    """One order's timeline: transitions, webhooks, deliveries, deadlines, warnings, refunds."""
    order = _order_by_reference(reference)
    if order is None:
        return problem(404, f"There is no order {reference}.", title="No such order", back=url_for("console.orders"))
    return respond("console/order.html", queries.order_timeline(order, utcnow()))


@bp.get("/outbox")
def outbox():
    """Deliveries of events to handlers, and scheduled commands; `status=dead` for dead letters,
    `status=waiting` for pending work waiting for an unavailable provider."""
    status = request.args.get("status") or None
    if status is not None and status not in queries.WORK_FILTERS:
        return problem(
            400,
            f"Unknown status {status!r}; use one of {', '.join(queries.WORK_FILTERS)}.",
            back=url_for("console.outbox"),
        )
    keep = re.fullmatch(r"(cmd-)?([1-9]\d{0,9})", request.args.get("keep") or "")
    keep = ("command" if keep.group(1) else "delivery", int(keep.group(2))) if keep else None
    data, details, commands = queries.outbox(utcnow(), status=status, page=_page(), keep=keep)
    return respond(
        "console/outbox.html",
        data,
        details=details,
        commands=commands,
        statuses=queries.WORK_FILTERS,
        discard_form=DiscardForm(),
        dead_groups=queries.dead_groups(),
    )


@bp.get("/restore-warnings")
def restore_warnings():
    """Stock a compensation could not give back; `state=open` for those awaiting an operator."""
    state = request.args.get("state") or None
    if state is not None and state not in queries.WARNING_STATES:
        return problem(
            400,
            f"Unknown state {state!r}; use one of {', '.join(queries.WARNING_STATES)}.",
            back=url_for("console.restore_warnings"),
        )
    data, details = queries.restore_warnings(utcnow(), state=state, page=_page())
    return respond("console/restore_warnings.html", data, details=details, states=queries.WARNING_STATES)


@bp.get("/webhooks")
def webhooks():
    """Every webhook delivery received, accepted or rejected, with the reason, newest first."""
    outcome = request.args.get("outcome") or None
    if outcome is not None and outcome not in queries.WEBHOOK_OUTCOMES:
        return problem(
            400,
            f"Unknown outcome {outcome!r}; use one of {', '.join(queries.WEBHOOK_OUTCOMES)}.",
            back=url_for("console.webhooks"),
        )
    return respond("console/webhooks.html", queries.webhooks(outcome=outcome, page=_page()))


@bp.get("/refunds")
def refunds():
    """Refunds of late money, oldest first; `status=failed` keeps those whose money did not go
    back and that no operator has dealt with (the dashboard's Failed refunds)."""
    status = request.args.get("status") or None
    if status is not None and status not in queries.REFUND_FILTERS:
        return problem(
            400,
            f"Unknown status {status!r}; use one of {', '.join(queries.REFUND_FILTERS)}.",
            back=url_for("console.refunds"),
        )
    return respond(
        "console/refunds.html", queries.refunds(utcnow(), status=status, page=_page()), statuses=queries.REFUND_FILTERS
    )


@bp.get("/sweeps")
def sweeps():
    """Reconciliation cycles with what each pass did, newest first."""
    return respond("console/sweeps.html", queries.sweeps(utcnow(), page=_page()), outcome_words=SWEEP_WORDS)


SWEEP_WORDS = {
    "lost_race": "lost races (someone else moved the order first)",
    "changed": "changed meanwhile",
    "open": "still open at the provider",
    "awaiting_async": "awaiting an async payment",
    "unavailable": "provider unreachable",
    "cancelled": "cancelled",
    "payment_failed": "payment failed",
    "proof_refused": "payment proof refused",
    "refund_created": "refunds queued",
    "errors": "not settled (see the problems)",
    "woken": "rows that waited for the provider run now (it answers again)",
}


# -- actions ---------------------------------------------------------------------------------

RECONCILE_WORDS = {
    "paid": "The provider confirms the payment: the order is now Paid.",
    "payment_failed": "The provider says the payment did not go through: the order is now PaymentFailed "
    "(its items stay held for a fresh payment window).",
    "cancelled": "The payment page expired at the end of the payment window: the order is now Cancelled and "
    "its stock is being given back.",
    "refund_created": "The provider holds money this order cannot take ({detail}); a refund is queued.",
    "already_refunded": "The provider holds money this order cannot take ({detail}); the refund was already "
    "on record, nothing more was queued.",
    "awaiting_async": "The customer finished checkout but the payment is still processing at the provider. "
    "Nothing to change yet; the webhook or the sweep will settle it.",
    "proof_refused": "The provider's payment does not match this order ({detail}); the order was left as it "
    "was. Check the payment at the provider.",
    "noop": "Nothing to change: {detail}.",
    "duplicate": "Already applied; nothing to change.",
    "unknown_order": "The provider's session does not name this order ({detail}); nothing changed.",
}


@bp.post("/orders/<reference>/reconcile")
def reconcile(reference):
    """Ask the provider about the order's payment now and apply the answer through the same
    guarded transition as the webhook and the sweep."""
    order = _order_by_reference(reference)
    back = url_for("console.order_detail", reference=reference)
    if order is None:
        return problem(404, f"There is no order {reference}.", title="No such order", back=back)
    order_id, ref, before = order.id, order.reference, order.status
    audit.about(f"order {ref}", order_id=order_id)
    try:
        applied = reconcile_order(order_id, source="console")
    except gateway.ProviderUnavailable as exc:
        log.warning("operator %s: reconcile of %s: provider unreachable: %s", _operator(), ref, exc)
        return problem(
            503,
            f"The payment provider could not be reached, so nothing changed: order {ref} is still "
            f"{before}. Try again in a minute; the reconciliation sweep keeps asking too.",
            title="Payment provider unreachable",
            back=back,
            reference=ref,
            order_status=before,
        )
    except gateway.ProviderRefused as exc:
        log.warning("operator %s: reconcile of %s: provider refused: %s", _operator(), ref, exc)
        return problem(
            502,
            f"The payment provider refused to answer about order {ref}'s payment session ({exc}). Nothing changed.",
            title="Payment provider refused",
            back=back,
            reference=ref,
            order_status=before,
        )
    db.session.rollback()
    now_status = db.session.get(Order, order_id).status
    message = f"Order {ref}: " + RECONCILE_WORDS.get(applied.outcome, "{detail}").format(detail=applied.detail)
    log.info("operator %s reconciled order %s: %s (%s -> %s)", _operator(), ref, applied.outcome, before, now_status)
    return done(
        message,
        {
            "reference": ref,
            "outcome": applied.outcome,
            "detail": applied.detail,
            "status_before": before,
            "status": now_status,
        },
        back,
        "ok" if applied.outcome in ("paid", "noop", "duplicate", "awaiting_async") else "warning",
    )


def _named(kind: str, work_id: int, row=None) -> tuple[int | str, str]:
    """The row's id as the outbox list shows it ("cmd-3" for a command), and words for it that
    say what it is and whose: "send_email cmd-3 (order BK-…)"."""
    ref = work_ref(kind, work_id)
    if row is None:
        return ref, f"{kind} {ref}"
    what = row.handler if kind == "delivery" else row.kind
    order = db.session.get(Order, row.order_id) if row.order_id is not None else None
    return ref, f"{what} {kind} {ref}" + (f" (order {order.reference})" if order is not None else "")


def _retry(kind: str, work_id: int):
    model = dispatch.TABLES[kind]
    back = url_for("console.outbox", status="dead")
    row = db.session.get(model, work_id)
    ref, name = _named(kind, work_id, row)
    audit.about(name, order_id=row.order_id if row is not None else None)
    if row is None:
        return problem(404, f"There is no {name}.", title=f"No such {kind}", back=back)
    if row.status != "dead":
        return problem(
            409,
            f"The {name} is {row.status}, not dead: only a dead letter can be retried.",
            back=back,
            id=ref,
            current_status=row.status,
        )
    db.session.rollback()
    if not dispatch.retry_dead(kind, work_id):
        current = db.session.get(model, work_id)
        return problem(
            409,
            f"The {name} changed meanwhile (now {current.status}); nothing done.",
            back=back,
            id=ref,
            current_status=current.status,
        )
    budget = current_app.config["OUTBOX_MAX_ATTEMPTS"]
    log.info("operator %s retried dead %s", _operator(), name)
    return done(
        f"The {name} will run again now, with a fresh budget of {budget} attempts; this list shows how it went.",
        {"id": ref, "kind": kind, "status": "pending"},
        back,
        keep=ref,
    )


def _discard(kind: str, work_id: int):
    model = dispatch.TABLES[kind]
    back = url_for("console.outbox", status="dead")
    row = db.session.get(model, work_id)
    ref, name = _named(kind, work_id, row)
    if row is None:
        return problem(404, f"There is no {name}.", title=f"No such {kind}", back=back)
    form = DiscardForm()
    audit.about(name, order_id=row.order_id, reason=(form.reason.data or "").strip() or None)
    if not form.validate():
        return problem(
            400,
            form.reason.errors[0] if form.reason.errors else "Say why this is discarded.",
            title="A reason is needed",
            back=back,
            id=ref,
        )
    if row.status != "dead":
        return problem(
            409,
            f"The {name} is {row.status}, not dead: only a dead letter can be discarded.",
            back=back,
            id=ref,
            current_status=row.status,
        )
    reason = form.reason.data.strip()
    db.session.rollback()
    if not dispatch.discard(kind, work_id, reason):
        current = db.session.get(model, work_id)
        return problem(
            409,
            f"The {name} changed meanwhile (now {current.status}); nothing done.",
            back=back,
            id=ref,
            current_status=current.status,
        )
    log.warning("operator %s discarded %s: %s", _operator(), name, reason)
    return done(
        f"The {name} is discarded: it will not run again.",
        {"id": ref, "kind": kind, "status": "discarded", "reason": reason},
        back,
        keep=ref,
    )


@bp.post("/outbox/retry-dead")
def retry_all_dead():
    """Every dead row of one handler or command kind runs again (form `what`: "delivery:<handler>"
    or "command:<kind>"): after an outage (the mail server, the provider) one click, not fifty."""
    back = url_for("console.outbox", status="dead")
    form = ActionForm()
    if not form.validate():
        return problem(400, "Your form expired; reload the page and try again.", back=back)
    kind, _, name = (request.form.get("what") or "").partition(":")
    if kind not in dispatch.TABLES or not name:
        return problem(400, "Say which dead letters to retry (what=delivery:<handler> or command:<kind>).", back=back)
    audit.about(f"every dead {name} {kind}")
    ids = dispatch.retry_all_dead(kind, name)
    log.info("operator %s retried %d dead %s rows of %s", _operator(), len(ids), kind, name)
    budget = current_app.config["OUTBOX_MAX_ATTEMPTS"]
    return done(
        f"{len(ids)} dead {name} {kind}{'s' if len(ids) != 1 else ''} will run again now, each with a "
        f"fresh budget of {budget} attempts.",
        {"what": f"{kind}:{name}", "retried": [work_ref(kind, i) for i in ids]},
        back,
    )


@bp.post("/outbox/<work:work>/retry")
def retry_work(work):
    """Run a dead delivery (`42`) or scheduled command (`cmd-42`) again with a fresh attempt budget."""
    return _retry(*work)


@bp.get("/outbox/<work:work>/discard")
def confirm_discard(work):
    """Are you sure? The outbox's Discard button leads here: what the row is, what it died of,
    and the form that asks for the reason and makes the POST (a script posts directly)."""
    kind, work_id = work
    model = dispatch.TABLES[kind]
    back = safe_next(request.args.get("next"), url_for("console.outbox", status="dead"))
    row = db.session.get(model, work_id)
    ref, name = _named(kind, work_id, row)
    if row is None:
        return problem(404, f"There is no {name}.", title=f"No such {kind}", back=back)
    if row.status != "dead":
        return problem(
            409,
            f"The {name} is {row.status}, not dead: only a dead letter can be discarded.",
            back=back,
            id=ref,
            current_status=row.status,
        )
    data = {
        "id": ref,
        "kind": kind,
        "what": name,
        "status": row.status,
        "attempts": row.attempts,
        "last_error": row.last_error,
    }
    return respond("console/discard.html", data, back=back, work=work, discard_form=DiscardForm(formdata=None))


@bp.post("/outbox/<work:work>/discard")
def discard_work(work):
    """Give up on a dead delivery or command for good; the form's `reason` is required."""
    return _discard(*work)


def _refund_for_action(refund_id: int):
    """(refund, its order's reference, where to go back) for a refund action; refund None when absent."""
    refund = db.session.get(Refund, refund_id)
    reference = db.session.get(Order, refund.order_id).reference if refund is not None else None
    back = (
        url_for("console.order_detail", reference=reference)
        if reference
        else url_for("console.refunds", status="failed")
    )
    return refund, reference, back


def _refund_answer(action, reference: str | None, back: str):
    """A refund action's answer: 404 / 409 in words, or what the refund is now (JSON, or back)."""
    facts = action.refund or {}
    if action.outcome == "missing":
        return problem(404, action.message, title="No such refund", back=back)
    if action.outcome == "refused":
        return problem(
            409,
            action.message,
            back=back,
            id=facts.get("id"),
            current_status=facts.get("status"),
            attempts=facts.get("attempts"),
        )
    payload = {
        "id": facts["id"],
        "order_reference": reference,
        "status": facts["status"],
        "attempts": facts["attempts"],
        "provider_refund_id": facts["provider_refund_id"],
        "settled_at": iso(facts["settled_at"]),
        "settled_by": facts["settled_by"],
        "reason": facts["settlement_reason"],
        "already": action.outcome == "already",
    }
    return done(action.message, payload, back, "ok" if action.outcome == "done" else "warning")


@bp.post("/refunds/<id:refund_id>/retry")
def retry_refund(refund_id):
    """Send a failed refund again: a new attempt at the provider with its own Idempotency-Key
    (form `attempt`: the attempt the operator saw, so a repeated submission retries once)."""
    refund, reference, back = _refund_for_action(refund_id)
    audit.about(
        f"refund {refund_id}" + (f" (order {reference})" if reference else ""),
        order_id=refund.order_id if refund is not None else None,
    )
    form = RetryRefundForm()
    if not form.validate():
        return problem(
            400,
            "attempt must be the attempt number the refund showed (a whole number from 1).",
            back=back,
            id=refund_id,
        )
    db.session.rollback()  # the use case reads the refund afresh, locked, in its own transaction
    action = refund_cases.retry_refund(refund_id, seen_attempt=form.attempt.data)
    if action.outcome == "done":
        log.warning("operator %s sent refund %s again: %s", _operator(), refund_id, action.message)
    return _refund_answer(action, reference, back)


@bp.post("/refunds/<id:refund_id>/settle")
def settle_refund(refund_id):
    """Record, with a reason, that a failed refund was settled outside the shop."""
    refund, reference, back = _refund_for_action(refund_id)
    form = SettleRefundForm()
    reason = (form.reason.data or "").strip()
    audit.about(
        f"refund {refund_id}" + (f" (order {reference})" if reference else ""),
        order_id=refund.order_id if refund is not None else None,
        reason=reason or None,
    )
    if not form.validate() or not reason:
        return problem(
            400,
            form.reason.errors[0] if form.reason.errors else "Say how this refund was settled outside the shop.",
            title="A reason is needed",
            back=back,
            id=refund_id,
        )
    operator = _operator()
    db.session.rollback()
    action = refund_cases.settle_refund(refund_id, reason=reason, operator=operator)
    if action.outcome == "done":
        log.warning("operator %s recorded refund %s as settled outside the shop: %s", operator, refund_id, reason)
    return _refund_answer(action, reference, back)


@bp.post("/restore-warnings/<id:warning_id>/resolve")
def resolve_warning(warning_id):
    """`action=fixed`: the operator fixed the stock by hand; the warning closes with a note.
    `action=retry`: run the compensation again; the warning closes only if the order's stock
    is now restored, otherwise it stays open with what happened (saga.warnings)."""
    back = url_for("console.restore_warnings", state="open")
    warning = db.session.get(RestoreWarning, warning_id)
    if warning is None:
        return problem(404, f"There is no restore warning {warning_id}.", title="No such warning", back=back)
    form = ResolveForm()
    action = (form.action.data or "").strip()
    audit.about(
        f"restore warning {warning_id} ({action or 'no action'})",
        order_id=warning.order_id,
        reason=(form.note.data or "").strip() or None,
    )
    if action not in ("fixed", "retry") or not form.validate():
        return problem(
            400,
            "Choose action “fixed” (you corrected the stock by hand) or “retry” (run the "
            "restore again); keep the note under 2000 characters.",
            back=back,
            id=warning_id,
        )
    if warning.state != "open":
        return problem(
            409,
            f"Restore warning {warning_id} is already {warning.state}: {warning.resolution or ''}",
            back=back,
            id=warning_id,
            state=warning.state,
        )
    now = utcnow()
    stamp = f"{now:%Y-%m-%d %H:%M} UTC, {_operator()}"
    if action == "fixed":
        return _fixed_by_hand(warning_id, stamp, (form.note.data or "").strip(), now, back)
    return _retry_restore(warning_id, stamp, now, back)


def _fixed_by_hand(warning_id: int, stamp: str, note: str, now, back: str):
    db.session.rollback()
    if not warnings.resolve_fixed_by_hand(warning_id, stamp, note, now):
        return problem(409, f"Restore warning {warning_id} was settled meanwhile.", back=back, id=warning_id)
    log.info("operator %s resolved restore warning %s as fixed by hand", _operator(), warning_id)
    return done(
        f"Restore warning {warning_id} resolved: stock fixed by hand.",
        {"id": warning_id, "state": "resolved", "outcome": "fixed"},
        back,
    )


def _retry_restore(warning_id: int, stamp: str, now, back: str):
    result = warnings.retry_restore(warning_id, stamp, now)
    if result.lost:
        return problem(409, f"Restore warning {warning_id} was settled meanwhile.", back=back, id=warning_id)
    if result.resolved:
        log.info("operator %s: restore retry resolved warning %s (%s)", _operator(), warning_id, result.outcome)
        return done(
            f"Restore warning {warning_id} resolved: {result.words}.",
            {"id": warning_id, "state": "resolved", "outcome": result.outcome},
            back,
            "warning" if result.fresh else "ok",
        )
    log.warning("operator %s: restore retry left warning %s open: %s", _operator(), warning_id, result.words)
    return done(
        f"Restore warning {warning_id} is still open: {result.words}.",
        {"id": warning_id, "state": "open", "outcome": result.outcome, "detail": result.words},
        back,
        "warning",
    )
