"""Prometheus gauges read from the database at scrape time: the database is the truth, so
every process (and every replica) reports the same numbers. The families that come from the
processes and Redis (heartbeats, nodes, queues) are liveness_metrics.py's."""

from __future__ import annotations

from flask import current_app
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import case, func, select

from ..domain.deadlines import FAILURE_PROVIDER, as_utc, utcnow
from ..domain.order import LIVE, LIVE_STATUSES, OrderStatus
from ..domain.refunds import NOT_RETURNED
from ..extensions import db, per_app, the_app
from ..models import (
    Order,
    OutboxDelivery,
    ReceiptOutcome,
    Refund,
    RestoreWarning,
    ScheduledCommand,
    UnknownPayment,
    UnknownPaymentStatus,
    WarningState,
    WebhookReceipt,
    WorkStatus,
)
from ..payments import checkout_queue
from ..provider import guard, watch
from ..scheduling.past_cycles import last_success_at
from ..scheduling.stuck import stuck_cutoff
from ..web import webhook_noise
from .liveness_metrics import liveness


class ShopCollector:
    def __init__(self, app):
        self.app = app

    def collect(self):
        with self.app.app_context():
            try:
                yield from self._collect()
            finally:
                db.session.remove()

    def _collect(self):
        now = utcnow()
        yield from _orders()
        yield from _stuck_orders(now)
        yield from _outbox(now)
        yield from _bookkeeping()
        yield from _refunds(now)
        yield from _unknown_payments()
        yield from _webhook_rejections()
        yield from _webhook_undelivered(now)
        yield from _webhook_noise_dropped()
        yield from _settings()
        yield from provider_breaker_metrics(now)
        yield from _payment_queue(now)
        yield from liveness(now)


def _orders():
    """Every order by status (one count over the status index), and the orders ever placed as a
    counter, for checkouts per minute: the shop deletes no order, so the count only grows (should
    one ever be deleted, rate() reads the drop as a counter reset)."""
    counts = dict(db.session.execute(select(Order.status, func.count()).group_by(Order.status)).all())
    by_status = GaugeMetricFamily("shop_orders", "Orders by status", labels=["status"])
    for status in OrderStatus:
        by_status.add_metric([status.value], counts.get(status, 0))
    yield by_status
    yield CounterMetricFamily(
        "shop_orders_placed", "Orders placed (checkouts that took stock), all time", value=sum(counts.values())
    )


def _stuck_orders(now):
    """Live orders unchanged for longer than the stuck age, by status."""
    cutoff = stuck_cutoff(now)
    stuck = GaugeMetricFamily(
        "shop_orders_stuck", "Live orders unchanged for longer than the stuck age", labels=["status"]
    )
    oldest = GaugeMetricFamily(
        "shop_orders_oldest_stuck_age_seconds", "Age of the oldest stuck order", labels=["status"]
    )
    rows = dict(
        (s, (c, m))
        for s, c, m in db.session.execute(
            select(Order.status, func.count(), func.min(Order.updated_at))
            .where(Order.status.in_(LIVE_STATUSES), Order.updated_at < cutoff)
            .group_by(Order.status)
        ).all()
    )
    for status in LIVE:
        count, min_ts = rows.get(status, (0, None))
        stuck.add_metric([status.value], count)
        oldest.add_metric([status.value], (now - as_utc(min_ts)).total_seconds() if min_ts else 0)
    yield stuck
    yield oldest


def _outbox(now):
    """Deliveries and scheduled commands by status, what waits for the provider, the oldest backlog."""
    # Dead letters are what an operator acts on, wherever the work came from: dead and
    # discarded count scheduled commands (refunds, emails, deadlines) as well, as the console's
    # outbox list does. pending/processing/done are event deliveries only: a pending command
    # is usually a deadline that is simply not due yet, which is not a backlog.
    deliveries = GaugeMetricFamily(
        "shop_outbox_deliveries",
        "Outbox deliveries by status; dead and discarded include scheduled commands",
        labels=["status"],
    )
    counts = dict(db.session.execute(select(OutboxDelivery.status, func.count()).group_by(OutboxDelivery.status)).all())
    command_counts = dict(
        db.session.execute(select(ScheduledCommand.status, func.count()).group_by(ScheduledCommand.status)).all()
    )
    for status in ("pending", "processing", "done", "dead", "discarded"):
        extra = command_counts.get(status, 0) if status in ("dead", "discarded") else 0
        deliveries.add_metric([status], counts.get(status, 0) + extra)
    yield deliveries
    # Pending work that failed only because the provider did not answer: not a dead letter
    # (it retries by itself, without spending attempts), but an outage an operator wants to see.
    waiting = sum(
        db.session.execute(
            select(func.count())
            .select_from(model)
            .where(model.status == WorkStatus.PENDING, model.failure_kind == FAILURE_PROVIDER)
        ).scalar_one()
        for model in (OutboxDelivery, ScheduledCommand)
    )
    yield GaugeMetricFamily(
        "shop_outbox_waiting_for_provider",
        "Pending deliveries and scheduled commands waiting for an unavailable provider",
        value=waiting,
    )
    commands = GaugeMetricFamily("shop_scheduled_commands", "Scheduled commands by status", labels=["status"])
    for status in ("pending", "processing", "done", "dead", "discarded", "obsolete"):
        commands.add_metric([status], command_counts.get(status, 0))
    yield commands

    oldest_pending = db.session.execute(
        select(func.min(OutboxDelivery.created_at)).where(
            OutboxDelivery.status.in_((WorkStatus.PENDING, WorkStatus.PROCESSING))
        )
    ).scalar()
    yield GaugeMetricFamily(
        "shop_outbox_oldest_pending_age_seconds",
        "Age of the oldest undelivered delivery",
        value=(now - as_utc(oldest_pending)).total_seconds() if oldest_pending else 0,
    )


def _bookkeeping():
    """Restore warnings, the last good sweep and webhook receipts."""
    open_warnings = db.session.execute(
        select(func.count()).select_from(RestoreWarning).where(RestoreWarning.state == WarningState.OPEN)
    ).scalar()
    yield GaugeMetricFamily("shop_restore_warnings_open", "Restore warnings awaiting an operator", value=open_warnings)
    last_ok = last_success_at()
    yield GaugeMetricFamily(
        "shop_reconciliation_last_success_timestamp_seconds",
        "When the last reconciliation cycle finished successfully",
        value=last_ok.timestamp() if last_ok else 0,
    )
    webhooks = GaugeMetricFamily(
        "shop_webhook_deliveries", "Webhook deliveries received, by outcome", labels=["outcome"]
    )
    counts = dict(
        db.session.execute(select(WebhookReceipt.outcome, func.count()).group_by(WebhookReceipt.outcome)).all()
    )
    for outcome in sorted(set(counts) | {"accepted", "duplicate", "rejected", "ignored", "failed"}):
        webhooks.add_metric([outcome], counts.get(outcome, 0))
    yield webhooks


def _refunds(now):
    """Refunds whose money did not go back and that nobody has dealt with: the dashboard's
    `refunds_failed` (the console's REFUND_NEEDS_OPERATOR), aged from the failure."""
    count, oldest = db.session.execute(
        select(func.count(), func.min(Refund.failed_at)).where(
            Refund.status.in_(NOT_RETURNED), Refund.settled_at.is_(None)
        )
    ).one()
    yield GaugeMetricFamily(
        "shop_refunds_failed", "Failed refunds awaiting an operator (retry, or settle outside the shop)", value=count
    )
    yield GaugeMetricFamily(
        "shop_refunds_failed_oldest_age_seconds",
        "Age of the oldest failed refund awaiting an operator, from its failure (0 when none)",
        value=max(0.0, (now - as_utc(oldest)).total_seconds()) if oldest else 0,
    )


def _unknown_payments():
    """Money for orders the database does not know (shop.payments.unknown_money), by status; the
    statuses an operator must act on are `refund_failed` and `not_ours`."""
    counts = dict(db.session.execute(select(UnknownPayment.status, func.count()).group_by(UnknownPayment.status)).all())
    family = GaugeMetricFamily(
        "shop_unknown_payments",
        "Payments the provider took for orders this database does not know, by what became of them",
        labels=["status"],
    )
    for status in sorted(set(counts) | {s.value for s in UnknownPaymentStatus}):
        family.add_metric([status], counts.get(status, 0))
    yield family


def _webhook_undelivered(now):
    """The provider's own count of the last hour's events it could not deliver to the shop, less
    those the shop has received since (shop.provider.watch, asked about every minute by the
    scheduler's watch): what tells a wrong signing secret from a scanner's noise. NaN when it was
    not asked lately (the provider away, or no scheduler): no evidence either way, and no rule
    comparing it fires."""
    view = watch.deliveries_view()
    fresh = view is not None and now.timestamp() - view["checked_at"] <= 3 * watch.DELIVERY_CHECK_SECONDS
    yield GaugeMetricFamily(
        "shop_webhook_events_undelivered",
        "Events of the last hour the provider reports it could not deliver to the shop (and the shop never got); "
        "NaN when not asked lately",
        value=view["count"] if view is not None and fresh else float("nan"),
    )


# A rejected webhook's reason is a sentence (shop/webhooks.py, `_reject`), some with the SDK's
# words after a colon (a stale timestamp's names the time): the metric names the kind by the
# sentence's start, so the label has a handful of values whatever the sentences carry. Sorted
# out by the database, which hands back one row per kind however many distinct sentences there are.
REJECTION_KINDS = (
    ("no signing secret", "no_secret"),
    ("bad signature", "bad_signature"),
    ("no stripe-signature", "no_signature"),
    ("empty body", "empty_body"),
    ("unparseable", "unparseable"),
    ("body over", "too_large"),
)
REJECTION_REASONS = tuple(kind for _, kind in REJECTION_KINDS) + ("other",)


def _webhook_rejections():
    """Rejected webhook deliveries by the kind of their reason: a bad signature or no secret is
    the shop refusing the provider's own deliveries; the others are usually not the provider."""
    kind = case(
        *((func.lower(WebhookReceipt.reason).like(f"{start}%"), name) for start, name in REJECTION_KINDS),
        else_="other",
    )
    # Grouped over a subquery's column: PostgreSQL does not take a CASE with bound parameters in
    # the select list and again in GROUP BY as the same expression.
    kinds = select(kind.label("kind")).where(WebhookReceipt.outcome == ReceiptOutcome.REJECTED).subquery()
    rows = db.session.execute(select(kinds.c.kind, func.count()).group_by(kinds.c.kind)).all()
    counts = dict.fromkeys(REJECTION_REASONS, 0)
    counts.update(rows)
    family = GaugeMetricFamily(
        "shop_webhook_rejections", "Rejected webhook deliveries received, by kind of reason", labels=["reason"]
    )
    for name, count in counts.items():
        family.add_metric([name], count)
    yield family


def _webhook_noise_dropped():
    """Unsigned webhook deliveries not kept (web.webhook_noise): refused past an address's limit,
    or trimmed past the cap; NaN when Redis, which counts them, does not answer."""
    counts = webhook_noise.dropped()
    family = CounterMetricFamily(
        "shop_webhook_noise_dropped", "Unsigned webhook deliveries not kept, by how", labels=["how"]
    )
    for how in webhook_noise.DROP_KINDS:
        family.add_metric([how], counts[how] if counts is not None else float("nan"))
    yield family


def _settings():
    """The settings the alert rules compare against (deploy/prometheus/alerts.yml), as the process
    answering the scrape has them: every process of the shop is meant to share them."""
    cfg = current_app.config
    yield GaugeMetricFamily(
        "shop_reconciliation_interval_seconds",
        "How often the reconciliation sweep runs (RECONCILIATION_INTERVAL_SECONDS)",
        value=cfg["RECONCILIATION_INTERVAL_SECONDS"],
    )
    yield GaugeMetricFamily(
        "shop_reconciliation_scheduled",
        "1 when the sweep runs (RECONCILIATION_ENABLED or UNPAID_ORDER_EXPIRY_ENABLED), 0 when both passes are off",
        value=1 if cfg["RECONCILIATION_ENABLED"] or cfg["UNPAID_ORDER_EXPIRY_ENABLED"] else 0,
    )
    yield GaugeMetricFamily(
        "shop_health_stale_seconds",
        "A process that has not beaten for this long is stalled (HEALTH_STALE_SECONDS)",
        value=cfg["HEALTH_STALE_SECONDS"],
    )


def _payment_queue(now):
    """The line for the payment page (payments.checkout_queue): how many orders wait, and for how long
    the first has."""
    waiting, first = checkout_queue.line_length(now)
    yield GaugeMetricFamily("shop_payment_queue_orders", "Orders waiting in line for their payment page", value=waiting)
    yield GaugeMetricFamily(
        "shop_payment_queue_oldest_wait_seconds",
        "How long the first order in line has waited (0: nobody waits)",
        value=(now - as_utc(first)).total_seconds() if first else 0,
    )


def provider_breaker_metrics(now=None):
    """The provider's circuit breaker (provider.guard) as every process sees it: its state, how
    long it has been away from closed, and its transitions counted in the shared state, so any
    process answers the same."""
    view = guard.get().breaker_view()
    state = GaugeMetricFamily(
        "shop_provider_breaker_state",
        "The payment provider's circuit breaker: 1 for its current state",
        labels=["state"],
    )
    for name in (guard.CLOSED, guard.OPEN, guard.HALF_OPEN):
        state.add_metric([name], 1 if view["state"] == name else 0)
    yield state
    # Open and half-open alternate while probes fail (each probe makes it half-open for a moment),
    # so the state gauge alone cannot say "open for five minutes": this counts from the moment it
    # left closed (`opened_at`, set only by closed -> open), as the dashboard's "since" does.
    opened = view.get("opened_at") or 0
    now_ts = (now or utcnow()).timestamp()
    yield GaugeMetricFamily(
        "shop_provider_breaker_open_seconds",
        "Seconds since the breaker left closed, while it is open or half-open (0 while closed)",
        value=max(0.0, now_ts - opened) if view["state"] != guard.CLOSED and opened else 0,
    )
    moves = CounterMetricFamily(
        "shop_provider_breaker_transitions",
        "Transitions of the provider's circuit breaker into each state",
        labels=["to"],
    )
    for name, count in view["transitions"].items():
        moves.add_metric([name], count)
    yield moves


def registry() -> CollectorRegistry:
    def build() -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(ShopCollector(the_app()))
        return reg

    return per_app("metrics_registry", build)
