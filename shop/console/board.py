"""The dashboard's cards: everything that needs a human, each with its own check (its charts are
in charts.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from flask import current_app, url_for
from sqlalchemy import func, select
from sqlalchemy.orm import defer

from ..domain.deadlines import as_utc
from ..domain.timestamps import iso
from ..extensions import db
from ..models import (
    OutboxDelivery,
    ReceiptOutcome,
    RestoreWarning,
    ScheduledCommand,
    WarningState,
    WebhookReceipt,
    WorkStatus,
)
from ..provider import watch
from ..web import webhook_noise
from .format import human_age
from .holds_card import holds_cards
from .waiting_card import waiting_card
from .words import webhook_event_words

REJECTED_WINDOW = timedelta(hours=24)
WEBHOOK_CHECK = (
    "Check the signing secret: STRIPE_WEBHOOK_SECRET must be the secret of the endpoint the provider "
    "sends to. Re-register the endpoint with `flask shop stripe-register-webhook` if it changed."
)


def _card(key, title, ok, count, words, check, url, *, stale=False, condition="") -> dict:
    """`condition`: what the card's state is made of, as text that changes when the condition
    does (a new failure, another process stalled): an operator's acknowledgement holds only while
    it is the same (shop.console.acks)."""
    return {
        "key": key,
        "title": title,
        "ok": bool(ok),
        "stale": stale,
        "count": count,
        "words": words,
        "check": check,
        "url": url,
        "condition": (f"{key}:{condition}" if not ok else "")[:200],
    }


def cards(data: dict, now: datetime) -> list[dict]:
    """One card per thing that can need a human. `ok` (green) only when that card's own check
    passed recently: a card whose check has not run for too long is `stale` and not green."""
    return [
        _processes_card(data),
        waiting_card(data, now, _card),
        _webhooks_card(now),
        _sweep_card(data, now),
        *_backlog_cards(data),
        _refunds_failed_card(data),
        *holds_cards(now, _card),
        _provider_card(data["provider"]),
    ]


def _processes_card(data: dict) -> dict:
    health = data["health"]
    procs = data["processes"]
    stalled = [p for p in procs if p["stalled"]]
    roles = {p["role"] for p in procs if not p["stalled"]}
    # A role whose only process is stalled is counted once, as that stalled process.
    missing = [r for r in ("worker", "scheduler") if r not in roles and r not in {p["role"] for p in stalled}]
    redis_ok = health["checks"].get("redis") == "ok"
    parts = []
    if stalled:
        parts.append(
            f"{len(stalled)} stalled: "
            + ", ".join(f"{p['role']} {p['name']} (last beat {human_age(p['beat_age_seconds'])} ago)" for p in stalled)
            + "."
        )
    if missing:
        parts.append(
            "No " + " and no ".join(missing) + " has beaten within " + human_age(health["stale_after_seconds"]) + "."
        )
    # A node whose every process stopped beating is gone: said with the work it still holds.
    parts += [n["words"][0].upper() + n["words"][1:] for n in data.get("nodes", ()) if n["state"] == "gone"]
    if not redis_ok:
        words = "Redis does not answer: no heartbeat can be read."
    else:
        words = " ".join(parts) or f"{len(procs)} running, each beat within {human_age(health['stale_after_seconds'])}."
    return _card(
        "processes",
        "Processes",
        redis_ok and not stalled and not missing,
        len(stalled) + len(missing),
        words,
        "Start or restart the stalled process (`flask shop up` runs them all); "
        "a stopped worker leaves payments and emails waiting.",
        url_for("console.dashboard") + "#processes",
        stale=not redis_ok,
        condition=f"{redis_ok}:" + ",".join(sorted([p["name"] for p in stalled] + missing)),
    )  # a stalled process was checked: it needs a human


def _signed_failures():
    """Deliveries that mean a payment update is being lost: signed with the shop's secret and
    still not applied (`failed`) or not usable (`rejected` after verifying), and rejections with
    nothing to verify with or from before the shop told noise apart (`signed` NULL)."""
    return (WebhookReceipt.outcome == ReceiptOutcome.FAILED) | (
        (WebhookReceipt.outcome == ReceiptOutcome.REJECTED)
        & ((WebhookReceipt.signed.is_(True)) | WebhookReceipt.signed.is_(None))
    )


NOISE_COUNT_CAP = 10_000
NOISE_SAMPLE = 1_000
NOISE_WORDS = (
    "Requests without this shop's signature (a scanner, a bot, a wrong URL): counted, never red by themselves. "
    "If they come from the provider's own addresses, the signing secret is wrong."
)


def _webhooks_card(now: datetime) -> dict:
    """Red only for the provider's own deliveries failing; unsigned or badly signed requests from
    the internet are counted with the address they came from (the noise) and never redden it."""
    since = now - REJECTED_WINDOW
    recent = WebhookReceipt.received_at >= since
    failing = (
        select(WebhookReceipt)
        .options(defer(WebhookReceipt.body))  # up to a megabyte each; the card needs none
        .where(WebhookReceipt.outcome.in_((ReceiptOutcome.FAILED, ReceiptOutcome.REJECTED)), recent, _signed_failures())
    )
    (count,) = db.session.execute(
        select(func.count()).select_from(failing.with_only_columns(WebhookReceipt.id).subquery())
    ).one()
    latest = None
    if count:
        latest = db.session.execute(
            failing.order_by(WebhookReceipt.received_at.desc(), WebhookReceipt.id.desc()).limit(1)
        ).scalar_one()
    # Noise can come by the hundred thousand (a scanner's flood): counted up to NOISE_COUNT_CAP
    # and its addresses taken from the latest NOISE_SAMPLE, so the refresh costs the same.
    noisy = [WebhookReceipt.outcome == ReceiptOutcome.REJECTED, recent, WebhookReceipt.signed.is_(False)]
    newest_first = (WebhookReceipt.received_at.desc(), WebhookReceipt.id.desc())
    (noise_count,) = db.session.execute(
        select(func.count()).select_from(select(WebhookReceipt.id).where(*noisy).limit(NOISE_COUNT_CAP + 1).subquery())
    ).one()
    noise_latest, addresses = None, []
    if noise_count:
        noise_latest = db.session.execute(
            select(WebhookReceipt).options(defer(WebhookReceipt.body)).where(*noisy).order_by(*newest_first).limit(1)
        ).scalar_one()
        sample = (
            select(WebhookReceipt.source_address.label("address"))
            .where(*noisy)
            .order_by(*newest_first)
            .limit(NOISE_SAMPLE)
            .subquery()
        )
        addresses = [
            {"address": a or "unknown", "count": n}
            for a, n in db.session.execute(
                select(sample.c.address, func.count())
                .group_by(sample.c.address)
                .order_by(func.count().desc(), sample.c.address)
                .limit(5)
            ).all()
        ]
    capped = noise_count > NOISE_COUNT_CAP
    noise_count = min(noise_count, NOISE_COUNT_CAP)
    if latest:
        words = (
            f"{count} signed deliver{'y' if count == 1 else 'ies'} from the provider failed in the last 24 h; the "
            f"latest {human_age(_age(now, latest.received_at))} ago: {latest.reason or 'no reason recorded'}"
        )
    else:
        words = "No delivery from the provider failed in the last 24 h."
    # The provider's own view (provider.watch.check_deliveries): what it could not deliver, which
    # a wrong signing secret causes and the shop's receipts alone cannot tell from a scanner.
    provider_view = watch.deliveries_view()
    if provider_view and now.timestamp() - provider_view["checked_at"] > 3 * watch.DELIVERY_CHECK_SECONDS:
        provider_view = None  # not asked lately: no evidence either way
    undelivered = provider_view["count"] if provider_view else 0
    reported = provider_view if undelivered else None  # the view, when it reports any
    if reported is not None:
        words += (
            f" The provider reports {undelivered} event{'' if undelivered == 1 else 's'} of the last hour it has not "
            f"delivered to the shop (the latest “{webhook_event_words(reported['latest_type'])}”, "
            f"{reported['latest_id']}): it "
            "is being refused or cannot reach the shop; if the noise below comes from the provider, the signing "
            "secret is wrong."
        )
    if noise_latest:
        words += (
            f" {noise_count:,}{'+' if capped else ''} unsigned or badly signed "
            f"request{'' if noise_count == 1 else 's'} (noise), the latest "
            f"{human_age(_age(now, noise_latest.received_at))} ago from "
            f"{noise_latest.source_address or 'an unknown address'}."
        )
    card = _card(
        "rejected_webhooks",
        "Webhooks",
        count == 0 and not undelivered,
        count + undelivered,
        words,
        WEBHOOK_CHECK,
        url_for(
            "console.webhooks",
            outcome=ReceiptOutcome.FAILED
            if latest and latest.outcome == ReceiptOutcome.FAILED
            else ReceiptOutcome.REJECTED,
        ),
        condition=f"{latest.id if latest else 0}:{reported['latest_id'] if reported is not None else ''}",
    )
    card["provider_undelivered"] = (
        {
            "count": undelivered,
            "latest_id": provider_view["latest_id"],
            "latest_type": provider_view["latest_type"],
            "checked_at": iso(datetime.fromtimestamp(provider_view["checked_at"], timezone.utc)),
        }
        if provider_view
        else None
    )
    card["latest_reason"] = latest.reason if latest else None
    card["latest_at"] = iso(as_utc(latest.received_at)) if latest else None
    card["noise"] = {
        "count": noise_count,
        "count_capped": capped,
        "latest_at": iso(as_utc(noise_latest.received_at)) if noise_latest else None,
        "latest_address": noise_latest.source_address if noise_latest else None,
        "latest_reason": noise_latest.reason if noise_latest else None,
        "addresses": addresses,
        "words": NOISE_WORDS,
        "dropped": webhook_noise.dropped(),
        "url": url_for("console.webhooks", outcome="rejected", signed="no"),
    }
    return card


def _sweep_card(data: dict, now: datetime) -> dict:
    interval = current_app.config["RECONCILIATION_INTERVAL_SECONDS"]
    sweep = data["last_sweep"]
    last_ok = data["last_successful_sweep_at"]
    fresh_limit = 2 * interval
    ok_age = _age(now, datetime.fromisoformat(last_ok)) if last_ok else None
    fresh = ok_age is not None and ok_age <= fresh_limit
    problems = sweep["problems"] if sweep else []
    errors = len(sweep["errors"]) if sweep else 0
    if not fresh:
        words = (
            f"No sweep has finished ok in the last {human_age(fresh_limit)} (it runs every "
            f"{human_age(interval)}): "
            + (f"the last good one finished {human_age(ok_age)} ago." if ok_age is not None else "none ever has.")
        )
    elif errors:
        words = f"The latest sweep could not settle {errors} order(s): " + "; ".join(
            (f"{p['order_reference']}: " if p.get("order_reference") else "") + p["what"] for p in problems[:3]
        )
    else:
        words = f"The latest sweep finished ok {human_age(ok_age)} ago, with no errors."
    return _card(
        "sweep",
        "Sweep",
        fresh and not errors,
        errors,
        words,
        "A sweep that stopped running means the scheduler or the workers are down (see Processes); "
        "errors name the orders to look at.",
        url_for("console.sweeps"),
        stale=not fresh,
        condition=f"{fresh}:{last_ok}:{sweep['id'] if sweep and errors else ''}",
    )


def _backlog_cards(data: dict) -> list[dict]:
    """What waits for a person: dead letters, open restore warnings, stuck orders."""
    dead, warn, stuck = data["dead_letters"], data["restore_warnings"], data["stuck_orders"]
    newest_dead = (
        db.session.execute(
            select(func.max(OutboxDelivery.id)).where(OutboxDelivery.status == WorkStatus.DEAD)
        ).scalar(),
        db.session.execute(
            select(func.max(ScheduledCommand.id)).where(ScheduledCommand.status == WorkStatus.DEAD)
        ).scalar(),
    )
    newest_warning = db.session.execute(
        select(func.max(RestoreWarning.id)).where(RestoreWarning.state == WarningState.OPEN)
    ).scalar()
    return [
        _backlog_card(
            "dead_letters",
            "Dead letters",
            dead["count"],
            f"{dead['count']} dead, the oldest {human_age(dead['oldest_age_seconds'])} old.",
            "Fix what they died of (the error says), then Retry; Discard with a reason what must not run.",
            url_for("console.outbox", status="dead"),
            condition=f"{dead['count']}:{newest_dead[0]}:{newest_dead[1]}",
        ),
        _backlog_card(
            "restore_warnings",
            "Restore warnings",
            warn["count"],
            f"{warn['count']} open, the oldest {human_age(warn['oldest_age_seconds'])} old: stock that "
            "did not come back.",
            "Count the shelf, correct the stock, then mark the warning fixed (or retry the restore).",
            url_for("console.restore_warnings", state="open"),
            condition=f"{warn['count']}:{newest_warning}",
            none="None open.",
        ),
        _backlog_card(
            "stuck_orders",
            "Stuck orders",
            stuck["count"],
            f"{stuck['count']} live and unchanged for over {human_age(stuck['stuck_after_seconds'])}, "
            f"the oldest {human_age(stuck['oldest_age_seconds'])}.",
            "Open the order: its timeline says what it waits for; Reconcile asks the provider now.",
            url_for("console.orders", stuck=1),
            condition=str(stuck["count"]),
        ),
    ]


def _backlog_card(key, title, count: int, words: str, check, url, *, condition: str, none: str = "None.") -> dict:
    """A card of things that wait for a person: green with `none` while there are none, else
    `words` (said of the `count` there are)."""
    return _card(key, title, count == 0, count, words if count else none, check, url, condition=condition)


def _refunds_failed_card(data: dict) -> dict:
    """Refunds whose money did not go back (failed or canceled at the provider) and that no
    operator has dealt with: each is a customer's money kept, so it stays red until retried or
    settled outside the shop."""
    count, oldest = data["refunds_failed"], data["refunds_failed_oldest_age_seconds"]
    return _backlog_card(
        "refunds_failed",
        "Failed refunds",
        count,
        f"{count} refund{'' if count == 1 else 's'} did not go through at the provider, the oldest failed "
        f"{human_age(oldest)} ago: the customer's money is not back.",
        "Open each one: Retry sends the refund again (a new attempt at the provider); Settle records, "
        "with a reason, that it was settled outside the shop. The customer was emailed that we are on it.",
        url_for("console.refunds", status="failed"),
        condition=str(count),
    )


def _provider_card(provider: dict) -> dict:
    """What the provider watch's latest check found (provider.watch), whether or not anyone paid,
    with how long ago; and not green while the breaker is open or the latest calls failed, even
    below the breaker's threshold. A check older than the watch's stale limit is no evidence:
    the card is then not green (no scheduler runs the watch)."""
    ago, check_ok = provider.get("checked_ago_seconds"), provider.get("check_ok")
    last = "never checked" if ago is None else f"last checked {human_age(ago)} ago"
    stale = ago is None or ago > watch.STALE_AFTER_SECONDS
    breaker_ok = provider["state"] == "closed" and not provider.get("failures")
    if stale:
        words = (
            f"{provider['words']} Not checked lately ({last}; the scheduler checks it every "
            f"{watch.CHECK_INTERVAL_SECONDS:g} s): is a scheduler running?"
        )
        healthy = False
    elif not check_ok:
        words = (
            f"Unreachable: the provider did not answer the shop's check ({provider.get('check_words') or 'no answer'})"
            f" for {human_age(provider.get('check_same_for_seconds'))}; {last}. Checkout takes orders and holds "
            "their stock; customers pay later with “Pay now”."
        )
        healthy = False
    else:
        healthy = breaker_ok
        words = f"{provider['words']} The provider answered the shop's check; {last}."
    card = _card(
        "provider",
        "Payment provider",
        healthy,
        0 if healthy else 1,
        words,
        "Look at the provider's status page; work waiting for it retries by itself.",
        url_for("console.outbox", status="waiting"),
        stale=stale,
        # Open and half-open alternate with every probe during an outage: one condition.
        condition=f"{stale}:{check_ok}:{provider.get('check_since')}:{provider['state'] == 'closed'}",
    )
    card["checked_at"] = provider.get("checked_at")
    card["checked_ago_seconds"] = ago
    return card


def _age(now: datetime, then: datetime) -> int:
    return max(0, int((now - as_utc(then)).total_seconds()))
