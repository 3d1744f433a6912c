"""The payment queue's wake-up: an order that joins the line for a payment session wakes it at
once instead of at its next look at the database."""

from __future__ import annotations

from flask import current_app

from .connection import redis_conn


def _payment_queue_key() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:payment-queue:wake"


def wake_payment_queue() -> None:
    """An order joined the line for a payment session: wake the payment queue now rather than at
    its next look at the database (payments.checkout_queue). One round trip; the list never holds
    more than a few wake-ups."""
    with redis_conn().pipeline(transaction=False) as pipe:
        pipe.lpush(_payment_queue_key(), 1)
        pipe.ltrim(_payment_queue_key(), 0, 3)
        pipe.expire(_payment_queue_key(), 60)
        pipe.execute()


def wait_for_payment_queue(timeout: float) -> bool:
    """Block until an order joins the line or `timeout` seconds pass; True when woken. A wake-up
    lost with Redis's data only costs the timeout."""
    conn = redis_conn()
    woken = conn.blpop([_payment_queue_key()], timeout=max(0.01, timeout))
    if woken:
        conn.delete(_payment_queue_key())  # the others say the same thing
    return bool(woken)
