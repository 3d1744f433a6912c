"""Acknowledging a red dashboard card: an operator says the condition is known (who, why, until
when). The card then shows as acknowledged instead of asking for a human, until its condition
changes (each card's `condition`, board.py: a new failure, another stalled process) or the time
runs out; then it is red again by itself. The action is audited like every console POST
(audit.py); the rows are the record of who acknowledged what."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import request, url_for
from sqlalchemy import select

from ..domain.deadlines import as_utc, utcnow
from ..domain.timestamps import iso
from ..extensions import db
from ..models import CardAcknowledgement
from . import audit, board, overview
from .answers import done, operator_name, problem
from .blueprint import bp
from .format import human_time

# How long an acknowledgement may last at most: a week, so nothing is silenced for good.
MAX_HOURS = 168
DEFAULT_HOURS = 4


def current(now: datetime) -> dict[str, CardAcknowledgement]:
    """The newest acknowledgement of each card that has not run out."""
    rows = db.session.execute(
        select(CardAcknowledgement)
        .where(CardAcknowledgement.until > now)
        .order_by(CardAcknowledgement.created_at, CardAcknowledgement.id)
    ).scalars()
    return {row.card: row for row in rows}


def ack_json(row: CardAcknowledgement) -> dict:
    return {
        "operator": row.operator,
        "reason": row.reason,
        "until": iso(as_utc(row.until)),
        "at": iso(as_utc(row.created_at)),
    }


def apply(cards: list[dict], now: datetime) -> dict:
    """Mark each red card whose condition an unexpired acknowledgement names, order the cards
    (red and unacknowledged first, then acknowledged, then green) and say in one line how many
    things need a human."""
    acks = current(now)
    for card in cards:
        row = acks.get(card["key"])
        held = row if not card["ok"] and row is not None and row.condition == card["condition"] else None
        card["acknowledged"] = ack_json(held) if held is not None else None
        card["needs_human"] = not card["ok"] and held is None
    cards.sort(key=lambda c: (not c["needs_human"], c["acknowledged"] is None))
    red = [c for c in cards if c["needs_human"]]
    acked = [c for c in cards if c["acknowledged"]]
    if red:
        words = (
            f"{len(red)} thing{'' if len(red) == 1 else 's'} need{'s' if len(red) == 1 else ''} a human: "
            + ", ".join(c["title"] for c in red)
            + "."
        )
    else:
        words = "Nothing needs a human."
    if acked:
        words += f" {len(acked)} acknowledged: " + ", ".join(
            f"{c['title']} (by {c['acknowledged']['operator']} until {human_time(c['acknowledged']['until'])})"
            for c in acked
        )
        words += "."
    return {"needs_human": len(red), "acknowledged": len(acked), "words": words}


def acknowledge(key: str, condition: str, operator: str, reason: str, hours: int, now: datetime) -> tuple[str, dict]:
    """Record an acknowledgement of `key`'s current `condition`. Idempotent: the same operator
    acknowledging the same condition with the same reason again while it holds writes nothing.
    Returns ("written" | "already", the acknowledgement's JSON)."""
    held = current(now).get(key)
    if held is not None and (held.condition, held.operator, held.reason) == (condition, operator, reason):
        db.session.rollback()
        return "already", ack_json(held)
    row = CardAcknowledgement(
        card=key,
        condition=condition,
        operator=operator,
        reason=reason,
        until=now + timedelta(hours=hours),
        created_at=now,
    )
    db.session.add(row)
    db.session.commit()
    return "written", ack_json(row)


@bp.post("/cards/<key>/acknowledge")
def acknowledge_card(key):
    """Acknowledge a red card: form `reason` (required), `hours` (1 to 168, default 4) and
    `condition` (the one the operator saw; a card that changed since is refused)."""
    back = url_for("console.dashboard")
    now = utcnow()
    audit.about(f"card {key[:40]}")
    data = {**overview.dashboard(now), **overview.liveness(now)}
    card = next((c for c in board.cards(data, now) if c["key"] == key), None)
    if card is None:
        return problem(404, f"There is no dashboard card {key!r}.", title="No such card", back=back)
    reason = (request.form.get("reason") or "").strip()
    if not reason:
        return problem(400, "Say why: the reason is what the next operator reads on the card.", back=back)
    if len(reason) > 2000:
        return problem(400, "Keep the reason under 2000 characters.", back=back)
    raw_hours = (request.form.get("hours") or str(DEFAULT_HOURS)).strip()
    # ASCII digits only: str.isdigit() is also true of "²", which int() refuses.
    if (
        not (raw_hours.isascii() and raw_hours.isdigit() and len(raw_hours) <= 6)
        or not 1 <= int(raw_hours) <= MAX_HOURS
    ):
        return problem(400, f"Hours must be a whole number from 1 to {MAX_HOURS}, not {raw_hours[:20]!r}.", back=back)
    audit.about(f"card {key}", reason=f"{reason} (for {int(raw_hours)} h)")
    if card["ok"]:
        return problem(409, f"The {card['title']} card is green: there is nothing to acknowledge.", back=back)
    seen = request.form.get("condition")
    if seen is not None and seen != card["condition"]:
        return problem(
            409,
            f"The {card['title']} card changed since you looked ({card['words']}). Look again, then acknowledge "
            "what it says now.",
            title="The card changed",
            back=back,
        )
    outcome, ack = acknowledge(key, card["condition"], operator_name(), reason, int(raw_hours), now)
    message = (
        f"{card['title']}: already acknowledged by {ack['operator']} until {human_time(ack['until'])}; nothing changed."
        if outcome == "already"
        else f"{card['title']} acknowledged until {human_time(ack['until'])}: it turns red again if its condition "
        "changes or when that time comes."
    )
    return done(message, {"card": key, "outcome": outcome, "acknowledged": ack}, back)
