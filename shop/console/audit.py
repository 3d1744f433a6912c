"""The console's audit trail: who did what, when, to what, why, and how it went.

Every POST under /console by a logged-in operator (login and logout aside) leaves one
`operator_actions` row, written by the blueprint's after-request hook once the action has
answered: an action added later is audited without remembering to. A view says what it acted
on with `about(...)`; `done()` and `problem()` (shop/console/answers.py) note the outcome in words.
The row is written in its own transaction after the action's: an action's commit never waits on
its audit row, and a failure to write one is logged at ERROR, never turned into a failed action.
"""

from __future__ import annotations

import logging

from flask import g, request
from flask_login import current_user

from ..domain.deadlines import utcnow
from ..domain.timestamps import iso
from ..extensions import db
from ..models import OperatorAction

log = logging.getLogger("shop.console")

NOT_AUDITED = {"console.login", "console.logout"}


def about(target: str, *, order_id: int | None = None, reason: str | None = None) -> None:
    """What the current action acts on (a work item, an order, a warning) and the operator's reason."""
    g.audit_target, g.audit_order_id, g.audit_reason = target, order_id, reason


def outcome(message: str) -> None:
    g.audit_outcome = message


def record_action(response):
    # An action that ends the operator's own session names them itself (logout-everywhere).
    operator = current_user.email if current_user.is_authenticated else g.get("audit_operator")
    if request.method != "POST" or request.endpoint in NOT_AUDITED or request.endpoint is None or not operator:
        return response
    try:
        db.session.rollback()  # whatever the action left open is not the audit's to commit
        db.session.add(
            OperatorAction(
                operator=operator,
                action=request.endpoint.removeprefix("console."),
                target=(g.get("audit_target") or request.path)[:200],
                order_id=g.get("audit_order_id"),
                reason=g.get("audit_reason"),
                status=response.status_code,
                outcome=g.get("audit_outcome") or response.status,
                created_at=utcnow(),
            )
        )
        db.session.commit()
    except Exception:
        db.session.rollback()
        log.error(
            "could not write the audit row of %s %s by %s",
            request.method,
            request.path,
            operator,
            exc_info=True,
        )
    return response


def action_json(row: OperatorAction, reference: str | None) -> dict:
    return {
        "id": row.id,
        "at": iso(row.created_at),
        "operator": row.operator,
        "action": row.action,
        "target": row.target,
        "order_reference": reference,
        "reason": row.reason,
        "status": row.status,
        "outcome": row.outcome,
    }
