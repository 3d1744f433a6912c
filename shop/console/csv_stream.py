"""A console list as CSV, streamed (export.py says which rows each list exports), so a million
rows go out without a million rows in memory. The rows are read in keyset pages of
CHUNK (`WHERE id < last id ORDER BY id DESC LIMIT CHUNK`, each an index range scan however deep
into the list it is, where OFFSET would read every row before the page again), selected as plain
columns so the session's identity map does not keep them, and written out as each page arrives.

A cell is text a spreadsheet may evaluate: one that starts with `=`, `+`, `-`, `@`, a tab or a
carriage return is a formula to Excel and LibreOffice (an email address such as
`=HYPERLINK(...)@example.com` is a valid one), so it is written with a leading `'`, which the
spreadsheet shows as text (OWASP, "CSV Injection")."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

from flask import Response, request, stream_with_context
from flask_login import current_user

from ..extensions import db
from ..models import OperatorAction

log = logging.getLogger("shop.console")

# Rows per keyset page: big enough that the round trips do not dominate, small enough that a page
# of wide rows stays a few hundred kilobytes.
CHUNK = 1000
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value) -> str:
    """One cell as text a spreadsheet shows and never runs."""
    if value is None:
        return ""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def keyset_rows(query, key, *, descending: bool = True, chunk: int | None = None) -> Iterator:
    """Every row of `query` (a select of columns, filtered, unordered), ordered by `key` (a unique
    column also selected, read back from each row as `row.<key name>`), read CHUNK rows at a time."""
    size = chunk or CHUNK
    ordered = key.desc() if descending else key.asc()
    last = None
    while True:
        page = query
        if last is not None:
            page = page.where(key < last if descending else key > last)
        rows = db.session.execute(page.order_by(ordered).limit(size)).all()
        # Each page its own short read: the connection goes back to the pool (and PgBouncer's
        # server connection to others) while a slow client takes the rows, instead of the whole
        # download holding one transaction open.
        db.session.rollback()
        yield from rows
        if len(rows) < size:
            return
        last = getattr(rows[-1], key.key)


def csv_response(name: str, header: Iterable[str], rows: Iterable, shape: Callable, now: datetime) -> Response:
    """A streamed CSV download: `header` first, then `shape(row)` (a list of cells) for each of
    `rows`, which are read as the download goes (the request's app context stays open until the
    last row is sent). The download is on the audit trail before it starts."""
    _audit_download(name, now)

    def lines():
        buffer = io.StringIO()
        writer = csv.writer(buffer)

        # Bytes: a direct_passthrough body goes to the server as it is, unencoded.
        def flush() -> bytes:
            text = buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
            return text.encode("utf-8")

        writer.writerow([safe_cell(h) for h in header])
        yield flush()
        pending = 0
        for row in rows:
            writer.writerow([safe_cell(c) for c in shape(row)])
            pending += 1
            if pending >= 200:  # a few hundred rows per write, not one tiny write per row
                yield flush()
                pending = 0
        if pending:
            yield flush()

    filename = f"{name}-{now.strftime('%Y%m%dT%H%M%SZ')}.csv"
    return Response(
        stream_with_context(lines()),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        direct_passthrough=True,
    )


def _audit_download(name: str, now: datetime) -> None:
    """A download of a list is a copy of customer data (emails, amounts) leaving the console: it is
    recorded like an action (`export_csv`, the list's address with its filters as the target),
    though a GET changes nothing. In its own transaction, before the rows are read; a failure to
    write it is logged, never a failed download (as audit.record_action does for actions)."""
    try:
        db.session.rollback()
        db.session.add(
            OperatorAction(
                operator=getattr(current_user, "email", "?"),
                action="export_csv",
                target=request.full_path.rstrip("?")[:200],
                status=200,
                outcome=f"downloaded the {name.replace('-', ' ')} list as CSV",
                created_at=now,
            )
        )
        db.session.commit()
    except Exception:
        db.session.rollback()
        log.error("could not write the audit row of the download %s", request.full_path, exc_info=True)
