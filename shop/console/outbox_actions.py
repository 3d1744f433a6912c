"""The outbox's operator actions: a dead letter (a delivery `42` or a scheduled command `cmd-42`)
run again with a fresh budget, every dead row of one kind at once after an outage, or one given
up for good with a reason; all through the outbox's own `dispatch`."""

from __future__ import annotations

import logging

from flask import current_app, request, url_for

from ..extensions import db
from ..models import Order, WorkStatus
from ..outbox import dispatch
from ..web.answers import respond
from ..web.requests import work_ref
from . import audit
from .answers import done, operator_name, problem, reason_needed
from .auth import safe_next
from .blueprint import bp
from .forms import ActionForm, DiscardForm
from .words import command_words, handler_words, work_words

SAY_KIND = {"delivery": handler_words, "command": command_words}

log = logging.getLogger("shop.console")


def _named(kind: str, work_id: int, row=None) -> tuple[int | str, str]:
    """The row's id as the outbox list shows it ("cmd-3" for a command), and words for it that
    say what it is and whose: "“Email to the customer” command cmd-3 (order BK-…)"."""
    ref = work_ref(kind, work_id)
    if row is None:
        return ref, f"{kind} {ref}"
    what = SAY_KIND[kind](row.handler if kind == "delivery" else row.kind)
    order = db.session.get(Order, row.order_id) if row.order_id is not None else None
    return ref, f"“{what}” {kind} {ref}" + (f" (order {order.reference})" if order is not None else "")


def _retry(kind: str, work_id: int):
    model = dispatch.TABLES[kind]
    back = url_for("console.outbox", status="dead")
    row = db.session.get(model, work_id)
    ref, name = _named(kind, work_id, row)
    audit.about(name, order_id=row.order_id if row is not None else None)
    if row is None:
        return problem(404, f"There is no {name}.", title=f"No such {kind}", back=back)
    if row.status != WorkStatus.DEAD:
        return _not_dead(row, name, ref, back, "retried")
    db.session.rollback()
    if not dispatch.retry_dead(kind, work_id):
        return _not_dead(db.session.get(model, work_id), name, ref, back)
    budget = current_app.config["OUTBOX_MAX_ATTEMPTS"]
    log.info("operator %s retried dead %s", operator_name(), name)
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
        return reason_needed(form, "Say why this is discarded.", back, id=ref)
    if row.status != WorkStatus.DEAD:
        return _not_dead(row, name, ref, back, "discarded")
    reason = (form.reason.data or "").strip()  # the form validated: there is one
    db.session.rollback()
    if not dispatch.discard(kind, work_id, reason):
        return _not_dead(db.session.get(model, work_id), name, ref, back)
    log.warning("operator %s discarded %s: %s", operator_name(), name, reason)
    return done(
        f"The {name} is discarded: it will not run again.",
        {"id": ref, "kind": kind, "status": "discarded", "reason": reason},
        back,
        keep=ref,
    )


def _not_dead(row, name: str, ref, back: str, verb: str | None = None):
    """409: the row is not a dead letter. With `verb`, as it was found; without, it changed
    between the look and the write, and nothing was done."""
    if verb:
        words = f"The {name} is not dead (it is {work_words(row.status)}): only a dead letter can be {verb}."
    else:
        words = f"The {name} changed meanwhile (now {work_words(row.status)}); nothing done."
    return problem(409, words, back=back, id=ref, current_status=row.status)


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
    log.info("operator %s retried %d dead %s rows of %s", operator_name(), len(ids), kind, name)
    budget = current_app.config["OUTBOX_MAX_ATTEMPTS"]
    return done(
        f"{len(ids)} dead “{SAY_KIND[kind](name)}” {kind}{'s' if len(ids) != 1 else ''} will run again now, "
        f"each with a fresh budget of {budget} attempts.",
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
    if row.status != WorkStatus.DEAD:
        return _not_dead(row, name, ref, back, "discarded")
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
