"""What the public webhook endpoint keeps of noise (docs/REFERENCE.md, Webhook): deliveries whose
signature did not verify. Anyone on the internet can send them, as fast as they like, and each
was a row kept at least a week: one client filled the database at about a megabyte a second.

Two bounds, neither of which ever touches a delivery that verified (shop/webhooks.py asks only
once the signature has failed):
- per client address (`request.remote_addr`), at most NOISE_PER_ADDRESS_PER_MINUTE receipts a
  minute are written, counted in Redis in fixed minutes; past it the request is answered 429
  and nothing is written. Redis unreachable: not throttled (the next bound still holds).
- in all, at most NOISE_KEPT noise receipts are kept: every TRIM_EVERY-th this process writes
  deletes those older than the newest NOISE_KEPT (so at most NOISE_KEPT plus TRIM_EVERY per web
  process at any time, each at most NOISE_BODY_CHARS of body).
What either drops is counted in Redis (`dropped()`): `/metrics` and the console's Webhooks card
say how many.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import cast

from flask import current_app
from redis.exceptions import RedisError
from sqlalchemy import CursorResult, delete, select

from .. import clock
from ..extensions import db
from ..models import ReceiptOutcome, WebhookReceipt
from ..queue.connection import redis_conn

log = logging.getLogger("shop.webhooks")

# The defaults; a test app may set its own (config WEBHOOK_NOISE_PER_MINUTE, _KEPT, _TRIM_EVERY).
NOISE_PER_ADDRESS_PER_MINUTE = 60
NOISE_KEPT = 10_000
TRIM_EVERY = 100
DROP_KINDS = ("throttled", "trimmed")

_written = itertools.count(1)
_written_lock = threading.Lock()


def _limit(name: str, default: int) -> int:
    return int(current_app.config.get(f"WEBHOOK_NOISE_{name}", default))


def _key(*parts: str) -> str:
    return ":".join((current_app.config["QUEUE_PREFIX"], "webhook-noise", *parts))


def may_record(address: str | None) -> bool:
    """Whether a noise receipt from `address` may be written now; counts it either way, and a
    refusal as `throttled`."""
    minute = int(clock.current().time() // 60)
    key = _key("address", address or "-", str(minute))
    try:
        conn = redis_conn()
        pipe = conn.pipeline()
        pipe.incr(key)
        pipe.expire(key, 120)
        seen = pipe.execute()[0]
        limit = _limit("PER_MINUTE", NOISE_PER_ADDRESS_PER_MINUTE)
        if seen <= limit:
            return True
        conn.hincrby(_key("dropped"), "throttled", 1)
        if seen == limit + 1:  # once a minute per address, not once per request
            log.warning("webhook noise from %s throttled: over %d unsigned deliveries this minute", address, limit)
    except (RedisError, OSError) as exc:
        log.debug("webhook noise not throttled: Redis did not answer (%s)", exc)
        return True
    return False


def is_noise():
    return (WebhookReceipt.outcome == ReceiptOutcome.REJECTED) & WebhookReceipt.signed.is_(False)


def after_written() -> None:
    """Called after a noise receipt was committed: every TRIM_EVERY-th, trim to NOISE_KEPT."""
    with _written_lock:
        n = next(_written)
    if n % _limit("TRIM_EVERY", TRIM_EVERY) == 0:
        try:
            trim()
        except Exception:  # the bound is kept by the next trim; the delivery was answered already
            db.session.rollback()
            log.exception("could not trim the webhook noise receipts")


def trim() -> int:
    """Delete the noise receipts older than the newest NOISE_KEPT; how many went."""
    cutoff = db.session.execute(
        select(WebhookReceipt.id)
        .where(is_noise())
        .order_by(WebhookReceipt.id.desc())
        .offset(_limit("KEPT", NOISE_KEPT))
        .limit(1)
    ).scalar()
    if cutoff is None:
        return 0
    result = db.session.execute(delete(WebhookReceipt).where(is_noise(), WebhookReceipt.id <= cutoff))
    gone = cast(CursorResult, result).rowcount  # a DELETE's result is a cursor's
    db.session.commit()
    if gone:
        try:
            redis_conn().hincrby(_key("dropped"), "trimmed", gone)
        except (RedisError, OSError):
            pass
    return gone


def dropped() -> dict[str, int] | None:
    """Noise receipts not kept, by how (`throttled`, `trimmed`); None when Redis does not answer."""
    try:
        counts = redis_conn().hgetall(_key("dropped"))
    except (RedisError, OSError):
        return None
    return {kind: int(counts.get(kind.encode(), 0)) for kind in DROP_KINDS}
