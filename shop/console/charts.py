"""The dashboard's small charts: orders placed, paid and cancelled per minute and the outbox's lag
over the last hour, counted in the database a minute at a time and drawn as SVG on the server."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Integer, cast, func, select

from ..domain.events import EventName
from ..domain.timestamps import iso
from ..extensions import db, per_app
from ..models import OutboxDelivery, OutboxEvent, WorkStatus

CHART_MINUTES = 60
SERIES = (
    ("placed", EventName.ORDER_PLACED),
    ("paid", EventName.ORDER_PAID),
    ("cancelled", EventName.ORDER_CANCELLED),
)
WIDTH, HEIGHT = 300, 60


def _minute_of(column, start: datetime):
    """Whole minutes from `start` to `column`, in SQL: the grouping happens in the database, so
    a busy hour is 60 rows per series, not one per order."""
    if db.session.get_bind().dialect.name == "sqlite":
        naive = start.replace(tzinfo=None).isoformat(sep=" ")
        return cast((func.julianday(column) - func.julianday(naive)) * 1440, Integer)
    return cast(func.floor(func.extract("epoch", column - start) / 60), Integer)


def _seconds_between(later, earlier):
    if db.session.get_bind().dialect.name == "sqlite":
        return (func.julianday(later) - func.julianday(earlier)) * 86400
    return func.extract("epoch", later - earlier)


def charts(now: datetime, waiting_seconds: float | None = None) -> dict:
    """Per minute of the last hour (the last minute is the current, partial one): orders placed,
    paid and cancelled (their events, ix_outbox_events_name_created_at), and the outbox's lag: the
    longest a delivery finished in that minute had waited since its event (ix_outbox_deliveries_completed_at)
    or, when longer, the age of the oldest work still waiting (`waiting_seconds`, ops.waiting) as
    this process saw it during that minute: a stalled worker finishes nothing, and its pile-up
    shows here while it grows.

    A finished minute cannot change any more (events and deliveries are written at `now`), so each
    process counts it once, the first time it sees it finished, and keeps it with the app; every
    request counts only the current minute. Counting the whole hour on every refresh cost more than
    the dashboard's whole budget at a million orders (bench/console.py prints what it costs); the
    hour counted once and then a minute at a time costs that once."""
    current = now.replace(second=0, microsecond=0)
    start = current - timedelta(minutes=CHART_MINUTES - 1)
    kept = per_app("console_chart_minutes", dict)  # minute -> ({series: count}, lag or None)
    wanted = [start + timedelta(minutes=i) for i in range(CHART_MINUTES - 1)]
    missing = [m for m in wanted if m not in kept]
    if missing:
        counted, lags = _per_minute(start, missing[0], current)
        for i, minute in enumerate(wanted):
            if minute >= missing[0]:
                kept[minute] = ({key: counted[key][i] for key in counted}, lags[i])
        for minute in [m for m in list(kept) if m < start]:
            kept.pop(minute, None)
    series, lag = _per_minute(start, current, None)
    for i, minute in enumerate(wanted):
        counts, worst = kept[minute]
        for key, n in counts.items():
            series[key][i] += n
        lag[i] = worst
    _add_waiting(lag, start, current, waiting_seconds)
    return {
        "start": iso(start),
        "minutes": CHART_MINUTES,
        "orders": series,
        "totals": {k: sum(v) for k, v in series.items()},
        "outbox_lag_seconds": lag,
    }


def _add_waiting(lag: list, start: datetime, current: datetime, waiting_seconds: float | None) -> None:
    """Each minute's lag at least the longest wait of work still waiting seen in that minute (kept
    per process, like the finished minutes)."""
    seen = per_app("console_chart_waiting", dict)  # minute -> longest wait seen then
    if waiting_seconds is not None:
        seen[current] = max(seen.get(current, 0.0), round(float(waiting_seconds), 1))
    for minute in [m for m in list(seen) if m < start]:
        seen.pop(minute, None)
    for minute, waited in seen.items():
        i = int((minute - start).total_seconds() // 60)
        if 0 <= i < CHART_MINUTES and waited > (lag[i] or 0):
            lag[i] = waited


def _per_minute(start: datetime, since: datetime, until: datetime | None) -> tuple[dict, list]:
    """The chart's series counted over [since, until) (until None: open-ended), indexed by whole
    minutes from `start`."""
    minute = _minute_of(OutboxEvent.created_at, start)
    series = {key: [0] * CHART_MINUTES for key, _ in SERIES}
    names = {str(name): key for key, name in SERIES}  # the stored event names, as text
    where = [OutboxEvent.name.in_(list(names)), OutboxEvent.created_at >= since]
    if until is not None:
        where.append(OutboxEvent.created_at < until)
    for name, m, n in db.session.execute(
        select(OutboxEvent.name, minute, func.count()).where(*where).group_by(OutboxEvent.name, minute)
    ).all():
        if m is not None and 0 <= m < CHART_MINUTES:
            series[names[name]][m] += n
    dminute = _minute_of(OutboxDelivery.completed_at, start)
    where = [OutboxDelivery.completed_at >= since, OutboxDelivery.status == WorkStatus.DONE]
    if until is not None:
        where.append(OutboxDelivery.completed_at < until)
    lag: list[float | None] = [None] * CHART_MINUTES
    for m, worst in db.session.execute(
        select(dminute, func.max(_seconds_between(OutboxDelivery.completed_at, OutboxDelivery.created_at)))
        .where(*where)
        .group_by(dminute)
    ).all():
        if m is not None and 0 <= m < CHART_MINUTES and worst is not None:
            lag[m] = max(0, round(float(worst), 1))
    return series, lag


def svg(values: list, start: datetime | str, what: str, unit: str) -> dict:
    """Bars for one series, in a WIDTH x HEIGHT viewBox, and its numbers in words."""
    if isinstance(start, str):
        start = datetime.fromisoformat(start)
    known = [v for v in values if v is not None]
    top = max(known, default=0)
    step = WIDTH / len(values)
    bars = []
    for i, v in enumerate(values):
        if not v:
            continue
        h = max(1.0, round(v / top * (HEIGHT - 2), 1))
        at = (start + timedelta(minutes=i)).strftime("%H:%M")
        bars.append(
            {
                "x": round(i * step, 2),
                "y": round(HEIGHT - h, 1),
                "w": round(step * 0.8, 2),
                "h": h,
                "label": f"{at} UTC: {_fmt(v)} {unit}",
            }
        )
    if what == "lag":
        words = (
            f"Outbox lag: work finished or still waiting in {len(known)} of the last {len(values)} minutes; "
            f"the longest wait was {_fmt(top)} seconds."
            if known
            else f"Outbox lag: no delivery finished and nothing waited in the last {len(values)} minutes."
        )
    else:
        total = sum(known)
        busiest = values.index(top) if top else None
        words = f"{total} order{'' if total == 1 else 's'} {what} in the last {len(values)} minutes" + (
            f"; at most {top} in one minute, at {(start + timedelta(minutes=busiest)).strftime('%H:%M')} UTC."
            if busiest is not None
            else "."
        )
    return {"bars": bars, "words": words, "width": WIDTH, "height": HEIGHT, "top": top}


def _fmt(v) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"
