"""The reconciliation sweep: the backstop for orders nothing else will speak for.

A webhook that never arrives produces no event to compensate, and a deadline row can be missing
(written before the mechanism existed, dead-lettered, deleted by hand). One cycle covers both:

  * one cutoff per cycle (now - RECONCILIATION_STUCK_AGE_SECONDS), two passes against it;
  * the expiry pass FIRST: PendingPayment / PaymentFailed orders last changed before the cutoff
    (a PendingPayment order, which never had a payment session, already once its short hold
    UNPAID_HOLD_WITHOUT_SESSION_SECONDS is over: `stuck.expiry_cutoffs`) are cancelled through
    `orders.cancel.cancel_unpaid`, the deadline's own expiry, whose OrderCancelled event
    restores the stock through the compensation handler. No provider call: there is nothing to
    ask about.
  * then the provider pass: PaymentInitiated orders with a session, last changed before the
    cutoff, are asked about at the provider and the answer applied (`payments.apply.ask_and_apply`),
    the same guarded path as the webhook (PaymentProof, paid -> Paid, expired -> PaymentFailed).
    Expiry runs first because this pass can move an order into PaymentFailed: an expiry pass
    running afterwards against the same cutoff would cancel it at once and erase the retry
    window the failed payment just opened.

Both passes select oldest first, bounded and projected to ids in SQL over
`ix_orders_status_updated_at` (one range scan per status), so a cycle costs the batch, not the
table. Each order is then reloaded and re-checked in its own transaction: one order's failure
never poisons the batch, and a webhook or a customer that moved the order first wins (the
version check turns our late save into a StaleDataError, logged and not retried).

Only one cycle runs anywhere at a time: a row in `leases` taken with a conditional UPDATE (or
an INSERT when absent; the primary key settles a tie), so two scheduler replicas never spend
the same provider call twice. The lease is short (20 s) and a heartbeat thread renews it every
quarter of it while the cycle works, conditionally on still holding it (see `lease`); it is
checked before each order, and a cycle whose heartbeat was refused or could not renew in time
(a frozen process, an unreachable database) stops before the next order, because another
replica may already be working the same ids. A holder that dies anywhere leaves a lease that
lapses within one lease length; the scheduler's poll then starts a cycle that takes it over.

Gates, one per consequence: UNPAID_ORDER_EXPIRY_ENABLED decides whether unpaid orders are ever
cancelled automatically (it also gates the per-order deadline at checkout), RECONCILIATION_ENABLED
decides whether we ask the provider. Either can be off while the other runs.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from flask import current_app

from .. import failpoints, logs, traces
from ..domain.order import UNPAID
from ..extensions import db
from ..outbox import uow
from ..outbox.leases import acquire_lease, holder_name, release_lease
from .cycle import (
    EXPIRY_OUTCOMES,
    NOT_ASKED,
    PROVIDER_OUTCOMES,
    CycleResult,
    CycleStatus,
    ErrorKind,
    PassName,
    ProviderOutcome,
    Tally,
    error_kind,
    expiry_line,
    order_error,
    provider_line,
    record_finish,
    record_skip,
    record_start,
    zeros,
)
from .lease import (
    DEFAULT_LEASE_SECONDS,
    LEASE_NAME,
    Clock,
    LeaseHeartbeat,
    LeaseKeeper,
    LeaseLost,
    lease_held_by_another,
)
from .passes.expiry import expire_stranded_order
from .passes.in_doubt import BULK_MAX_ORDERS, BULK_THRESHOLD, orders_in_doubt, settle_from_events
from .passes.late_money import check_cancelled_payment, watched_cancelled_ids
from .passes.pending_refunds import follow_pending_refunds
from .passes.provider import reconcile_stuck_payment, wake_work_waiting_for_the_provider
from .passes.unknown_money import scan_for_unknown_money
from .stuck import expiry_cutoffs, stuck_cutoff, stuck_order_ids

log = logging.getLogger("shop.sweep")

# After this many provider calls in a row not answered (or not made: the rate budget spent) the
# provider pass stops asking: each costs a timeout plus retries, or waits for the budget, and a
# down or busy provider would otherwise eat the whole lease.
UNAVAILABLE_STREAK_LIMIT = 3


def run_cycle(now: datetime | None = None) -> CycleResult:
    """Run one reconciliation cycle under the sweep lease; record it; return what it did."""
    cfg = current_app.config
    clock = Clock(now)
    started = clock()
    cutoff = stuck_cutoff(started)
    expiry_on, provider_on = cfg["UNPAID_ORDER_EXPIRY_ENABLED"], cfg["RECONCILIATION_ENABLED"]
    lease_seconds = float(cfg.get("RECONCILIATION_LEASE_SECONDS", DEFAULT_LEASE_SECONDS))
    holder = holder_name()
    db.session.rollback()  # start from a clean transaction whatever the caller left behind

    if not (expiry_on or provider_on):
        return record_skip(
            CycleResult(CycleStatus.SKIPPED, cutoff, started, reason="both passes are turned off"), holder, clock
        )
    lease = acquire_lease(LEASE_NAME, holder, started, lease_seconds)
    if not lease:
        reason = lease_held_by_another()
        log.info("sweep: skipped, %s", reason)
        return record_skip(CycleResult(CycleStatus.SKIPPED, cutoff, started, reason=reason), holder, clock)

    result = CycleResult(
        CycleStatus.OK,
        cutoff,
        started,
        expiry=zeros(EXPIRY_OUTCOMES) if expiry_on else None,
        provider=zeros(PROVIDER_OUTCOMES) if provider_on else None,
    )
    if lease.taken_from:
        # Not an error of this cycle (it settles the orders that one left), but the console is
        # where an operator learns that a process died in the middle of a cycle.
        result.notes.append(
            f"took over the sweep lease of {lease.taken_from}, a process on this machine "
            "that no longer exists (it died during its cycle)"
        )
    heartbeat = LeaseHeartbeat(
        db.engine, LEASE_NAME, holder, started + timedelta(seconds=lease_seconds), lease_seconds, clock
    ).start()
    try:
        result.cycle_id = record_start(result, holder)
        with traces.span("sweep cycle", attributes={"backstop.cycle_id": result.cycle_id}):
            _run_passes(result, cfg["RECONCILIATION_BATCH_SIZE"], clock, LeaseKeeper(heartbeat))
    except Exception as exc:
        _cycle_failed(result, exc)
    finally:
        heartbeat.stop()
        result.finished_at = clock()
        try:
            record_finish(result)
        finally:
            release_lease(LEASE_NAME, holder)
            heartbeat.join(timeout=lease_seconds)
    log.info(
        "sweep: cycle %s %s; %s; %s",
        result.cycle_id,
        result.status,
        expiry_line(result.expiry),
        provider_line(result.provider),
    )
    return result


def _cycle_failed(result: CycleResult, exc: Exception) -> None:
    """The cycle ended by an error (called in its `except`): rolled back, and the cycle failed with
    the lease lost, or with the error's kind."""
    uow.rollback(db.session)
    if isinstance(exc, LeaseLost):
        log.warning("sweep: %s", exc)
        result.status, result.reason = CycleStatus.FAILED, "lost the lease"
        result.errors.append(
            {"pass": PassName.CYCLE, "order_id": None, "kind": ErrorKind.LEASE_LOST, "error": str(exc)}
        )
        return
    log.exception("sweep: the cycle failed")
    result.status, result.reason = CycleStatus.FAILED, f"{type(exc).__name__}"
    result.errors.append(
        {
            "pass": PassName.CYCLE,
            "order_id": None,
            "kind": error_kind(exc),
            "error": f"{type(exc).__name__}: {exc}"[:500],
        }
    )


def _run_passes(result: CycleResult, batch: int, clock, keep_lease) -> None:
    """The passes that are on (a pass is on when its counts exist), oldest orders first."""
    cutoff = result.cutoff
    # Expiry first, so an order the provider pass moves to PaymentFailed keeps its window.
    if result.expiry is not None:
        cutoffs = expiry_cutoffs(result.started_at, cutoff)  # an order without a session: its short hold
        ids = stuck_order_ids(UNPAID, cutoff, batch, cutoffs=cutoffs)
        _run_pass(
            PassName.EXPIRY,
            ids,
            lambda oid: expire_stranded_order(oid, cutoffs),
            result.expiry,
            result.errors,
            keep_lease,
        )
    if result.provider is not None:
        doubt = orders_in_doubt(cutoff, clock(), BULK_MAX_ORDERS)
        settled = (
            settle_from_events(doubt, cutoff, result.provider, result.errors, keep_lease, clock)
            if len(doubt) >= BULK_THRESHOLD
            else set()
        )
        ids = [order_id for order_id, _, _ in doubt if order_id not in settled][:batch]
        _run_pass(
            PassName.PROVIDER,
            ids,
            lambda oid: reconcile_stuck_payment(oid, cutoff, clock()),
            result.provider,
            result.errors,
            keep_lease,
        )
        # Then cancelled orders whose money may still come (a lost late-payment webhook).
        ids = watched_cancelled_ids(clock(), batch)
        _run_pass(
            PassName.PROVIDER,
            ids,
            lambda oid: check_cancelled_payment(oid, clock()),
            result.provider,
            result.errors,
            keep_lease,
        )
        # Then pending refunds no watch follows (a paid order's): a lost refund.failed still arrives.
        follow_pending_refunds(result.provider, result.errors, keep_lease, clock)
        # Then money the provider took that no order holds (a restored copy's missing payments).
        scan_for_unknown_money(result.provider, result.errors, keep_lease, clock)
        woken = wake_work_waiting_for_the_provider(clock())
        if woken:
            result.provider[Tally.WOKEN] = woken


def _run_pass(name: PassName, ids: list[int], work, counts: dict, errors: list, keep_lease) -> None:
    """One pass over `ids`, in its span (with tracing on), each order in a span of its own."""
    with traces.span(f"sweep {name} pass", attributes={"backstop.orders": len(ids)}):
        _run_pass_orders(name, ids, work, counts, errors, keep_lease)


def _run_pass_orders(name: PassName, ids: list[int], work, counts: dict, errors: list, keep_lease) -> None:
    in_a_row, last = 0, ProviderOutcome.UNAVAILABLE  # provider calls not made or not answered, the latest
    for position, order_id in enumerate(ids):
        if not keep_lease():
            raise LeaseLost(
                f"the sweep lease lapsed or was taken over before order {order_id} "
                f"({name} pass); stopped with {len(ids) - position} order(s) left"
            )
        if name is PassName.PROVIDER and in_a_row >= UNAVAILABLE_STREAK_LIMIT:
            _stop_asking(counts, last, in_a_row, len(ids) - position)
            return
        # Each order's lines name it, and the next order's do not (shop.logs).
        this_order = {"backstop.order_id": order_id}
        with logs.scope(order_id=order_id), traces.span(f"sweep {name} order", attributes=this_order):
            try:
                outcome = work(order_id)
            except Exception as exc:
                uow.rollback(db.session)
                log.exception("sweep: %s pass failed on order %s; continuing with the next", name, order_id)
                counts[Tally.ERRORS] += 1
                errors.append(order_error(name, order_id, exc))
                continue
        counts[outcome] = counts.get(outcome, 0) + 1
        in_a_row, last = (in_a_row + 1, outcome) if outcome in NOT_ASKED else (0, last)
        failpoints.hit("sweep.after_order")
    if name is PassName.PROVIDER:
        _warn_not_asked(counts)


# Why a pass asked no more, by the last of the calls in a row that were not made or answered.
_STOPPED_BECAUSE = {
    ProviderOutcome.UNAVAILABLE: "the payment provider did not answer",
    ProviderOutcome.HELD_BACK: "the provider's rate budget was spent",
}


def _stop_asking(counts: dict, last: ProviderOutcome, in_a_row: int, left: int) -> None:
    counts[last] = counts.get(last, 0) + left
    log.warning(
        "sweep: %s %d times in a row; %d more order(s) wait for the next cycle", _STOPPED_BECAUSE[last], in_a_row, left
    )


def _warn_not_asked(counts: dict) -> None:
    if counts.get(ProviderOutcome.UNAVAILABLE):
        log.warning(
            "sweep: the payment provider was unreachable for %d order(s); they are retried next cycle",
            counts[ProviderOutcome.UNAVAILABLE],
        )
    if counts.get(ProviderOutcome.HELD_BACK):
        log.warning(
            "sweep: %d order(s) not asked about: the provider's rate budget was spent (the provider may be "
            "fine); they are asked next cycle",
            counts[ProviderOutcome.HELD_BACK],
        )
