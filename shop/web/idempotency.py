"""`Idempotency-Key` on the storefront's POSTs (docs/REFERENCE.md, Storefront): a JSON client that
retries after a timeout gets the first answer again instead of acting twice.

The first request with a key claims it (one row per browser and key, by a unique constraint, in
its own commit), runs, and stores its answer; a repeat with the same key and the same method,
path and body gets that answer with `Idempotent-Replayed: true` and runs nothing; the same key
with another body is a 422; a key whose first request is still running is a 409. A first request
that failed (a 5xx, or an error) leaves no answer: its key may be tried again. Kept a day, then
pruned (shop.scheduling.prune_kinds). Without the header nothing changes.

The rows are written through the request's session, each in a commit of its own: the claim before
the request runs (SQLite has one writer, so a second connection would wait for the request's own
transaction), the answer after it, once the request's last transaction has ended."""

from __future__ import annotations

import functools
import hashlib
from datetime import timedelta
from typing import Any, Callable

from flask import Response, jsonify, make_response, request
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from ..domain.deadlines import utcnow
from ..extensions import db
from ..models import AnswerState, IdempotentRequest
from ..outbox.tables import rows_matched, table_of
from .answers import browser_id, wants_json

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
# A first request still "running" this long after its claim died with its process: its key is
# taken over (the request never answered, so nothing was replayed from it).
ABANDONED_AFTER = timedelta(minutes=2)
# The headers of an answer that a replay gives again (the browser's cookie is not one).
KEPT_HEADERS = ("Location", "Content-Type", "Retry-After")

_table = table_of(IdempotentRequest)


def idempotent(view: Callable[..., Any]) -> Callable[..., Any]:
    """The view, answering repeats of a request sent with an Idempotency-Key from its first answer."""

    @functools.wraps(view)
    def guarded(*args, **kwargs):
        key = request.headers.get(HEADER)
        if key is None:
            return view(*args, **kwargs)
        refused = _refusal_of(key)
        if refused is not None:
            return respond_error(400, refused)
        scope = browser_id()  # made now for a client without one: its retry carries it
        claim = _claim(scope, key, _fingerprint())
        if not isinstance(claim, int):
            return claim
        try:
            answer = make_response(view(*args, **kwargs))
        except BaseException:
            _forget(claim)
            raise
        if answer.status_code >= 500:
            _forget(claim)
        else:
            _keep(claim, answer)
        return answer

    return guarded


def respond_error(status: int, message: str) -> Response:
    """A refusal in words: JSON `{"error", "status"}` as every error of the shop, else plain text."""
    if wants_json():
        answer = jsonify({"error": message, "status": status})
    else:
        answer = Response(message + "\n", mimetype="text/plain")
    answer.status_code = status
    return answer


def _refusal_of(key: str) -> str | None:
    if not key or len(key) > MAX_KEY_LENGTH or not all(" " < c < "\x7f" for c in key):
        return f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters without spaces."
    return None


def _fingerprint() -> str:
    """What makes a repeat the same request: the method, the path with its query, the body."""
    digest = hashlib.sha256()
    for part in (request.method, request.full_path, request.content_type or ""):
        digest.update(part.encode() + b"\0")
    # A form is parsed (by the CSRF check) before the view, which consumes the raw body: its
    # fields then stand for it. Any other body (JSON) is still there to read.
    for name, value in sorted(request.form.items(multi=True)):
        digest.update(f"{name}={value}".encode() + b"\0")
    digest.update(request.get_data(cache=True))
    return digest.hexdigest()


def _claim(scope: str, key: str, fingerprint: str) -> int | Response:
    """The row id of a claim this request now holds, or the answer for a repeat (the stored one,
    422 for another body, 409 while the first still runs)."""
    now, session = utcnow(), db.session
    session.commit()  # whatever the request opened before its view: nothing of it is lost
    try:
        with session.begin_nested():
            claimed = session.execute(
                insert(_table)
                .values(scope=scope, key=key, fingerprint=fingerprint, state=AnswerState.RUNNING, created_at=now)
                .returning(_table.c.id)
            ).scalar_one()
        session.commit()
        return claimed
    except IntegrityError:
        pass
    row = session.execute(select(_table).where(_table.c.scope == scope, _table.c.key == key)).one()
    if row.fingerprint != fingerprint:
        session.rollback()
        return respond_error(422, f"This {HEADER} was used for another request; use a new key for this one.")
    if row.state == AnswerState.DONE:
        session.rollback()
        return _replay(row)
    abandoned = session.execute(
        update(_table)
        .where(_table.c.id == row.id, _table.c.state == AnswerState.RUNNING)
        .where(_table.c.created_at < now - ABANDONED_AFTER)
        .values(created_at=now)
    )
    session.commit()
    if rows_matched(abandoned) == 1:
        return row.id
    answer = respond_error(409, f"The first request with this {HEADER} is still running; try again in a moment.")
    answer.headers["Retry-After"] = "1"
    return answer


def _replay(row) -> Response:
    answer = Response(row.answer_body or b"", status=row.answer_status)
    for name, value in (row.answer_headers or {}).items():
        answer.headers[name] = value
    answer.headers[REPLAYED] = "true"
    return answer


def _keep(claim: int, answer: Response) -> None:
    headers = {name: answer.headers[name] for name in KEPT_HEADERS if name in answer.headers}
    db.session.rollback()  # the view committed what it did; a read it began after is ended here
    db.session.execute(
        update(_table)
        .where(_table.c.id == claim)
        .values(
            state=AnswerState.DONE,
            answer_status=answer.status_code,
            answer_headers=headers,
            answer_body=answer.get_data(),
            completed_at=utcnow(),
        )
    )
    db.session.commit()


def _forget(claim: int) -> None:
    db.session.rollback()
    db.session.execute(_table.delete().where(_table.c.id == claim, _table.c.state == AnswerState.RUNNING))
    db.session.commit()
