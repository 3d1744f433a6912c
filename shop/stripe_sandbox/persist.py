"""The sandbox's world in a file, so a demo's restart keeps what its user made.

`flask shop up` runs its sandbox with `--state-file`: sessions, payment intents, charges,
refunds, webhook endpoints, events (with their deliveries), idempotency records, the account's
settings, the clock offset and the sequence counter are loaded at start and written back whenever they change (at
most every `WRITE_EVERY` seconds) and on shutdown. Faults are not kept: a restarted sandbox
behaves, whatever a test or an operator scripted before.

The file is written atomically (a temporary file in the same folder, then `os.replace`), so a
crash mid-write leaves the previous state. A file that cannot be read is moved aside with a
line saying why, and the sandbox starts empty: losing demo payments is better than not
starting.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import asdict

from .account import Account, read_changes
from .objects import (
    Attempt,
    Charge,
    Delivery,
    EventRecord,
    LineItem,
    PaymentIntent,
    Refund,
    Session,
    WebhookEndpoint,
)
from .state import Sandbox, StoredResponse

log = logging.getLogger(__name__)

FORMAT = 1
WRITE_EVERY = 0.5  # seconds between checks for a change worth writing


def snapshot(sandbox: Sandbox) -> dict:
    """Everything worth keeping, as JSON-ready data. Call with `sandbox.lock` held."""
    wall_minus_monotonic = time.time() - time.monotonic()
    return {
        "format": FORMAT,
        "seq": sandbox._seq,
        "clock_offset": sandbox.clock_offset,
        "account": sandbox.account.as_dict(),
        "sessions": [asdict(s) for s in sandbox.sessions.values()],
        "payment_intents": [asdict(p) for p in sandbox.payment_intents.values()],
        "charges": [asdict(c) for c in sandbox.charges.values()],
        "refunds": [asdict(r) for r in sandbox.refunds.values()],
        "endpoints": [asdict(e) for e in sandbox.endpoints.values()],
        "events": [{**asdict(e), "body": _b64(e.body)} for e in sandbox.events.values()],
        "idempotency": [
            {"api_key": api_key, "key": key, **asdict(stored), "body": _b64(stored.body)}
            for (api_key, key), stored in sandbox.idempotency.items()
        ],
        # "pay later" settlements are due on the monotonic clock, which a restart resets.
        "settlements": {
            sid: [due + wall_minus_monotonic, result] for sid, (due, result) in sandbox._settlements.items()
        },
    }


def restore(sandbox: Sandbox, data: dict) -> None:
    """Replace the sandbox's world with `data` (from `snapshot`). Raises ValueError, KeyError or
    TypeError on a file that is not one; the sandbox is unchanged then."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a sandbox state file of format {FORMAT}")
    sessions = {
        d["id"]: Session(**{**d, "line_items": [LineItem(**i) for i in d["line_items"]]}) for d in data["sessions"]
    }
    intents = {d["id"]: PaymentIntent(**d) for d in data["payment_intents"]}
    charges = {d["id"]: Charge(**d) for d in data["charges"]}
    refunds = {d["id"]: Refund(**d) for d in data["refunds"]}
    endpoints = {d["id"]: WebhookEndpoint(**d) for d in data["endpoints"]}
    events = {
        d["id"]: EventRecord(
            **{
                **d,
                "body": _unb64(d["body"]),
                "deliveries": [
                    Delivery(**{**x, "attempts": [Attempt(**a) for a in x["attempts"]]}) for x in d["deliveries"]
                ],
            }
        )
        for d in data["events"]
    }
    idempotency = {
        (d["api_key"], d["key"]): StoredResponse(
            method=d["method"],
            path=d["path"],
            fingerprint=d["fingerprint"],
            status=d["status"],
            body=_unb64(d["body"]),
            request_id=d["request_id"],
        )
        for d in data["idempotency"]
    }
    monotonic_minus_wall = time.monotonic() - time.time()
    settlements = {
        sid: (float(due) + monotonic_minus_wall, str(result)) for sid, (due, result) in data["settlements"].items()
    }
    seq, offset = int(data["seq"]), float(data["clock_offset"])
    # A file from before the account was kept has none: the defaults, as on a fresh sandbox.
    account = Account()
    account.update(read_changes(data.get("account", {})))

    with sandbox.lock:
        sandbox.sessions, sandbox.payment_intents, sandbox.charges = sessions, intents, charges
        sandbox.refunds, sandbox.endpoints, sandbox.events = refunds, endpoints, events
        sandbox.idempotency, sandbox._settlements = idempotency, settlements
        sandbox._seq, sandbox.clock_offset = seq, offset
        sandbox.account = account
        sandbox._open_sessions = {s.id for s in sessions.values() if s.status == "open"}
        sandbox._holds = {p.id for p in intents.values() if p.status == "requires_capture"}
        sandbox._held = []
        # Deliveries that were still due (or held by a fault that is not kept) go out again at
        # their time: a receiver dedups by event id, as it must for Stripe's own retries.
        now = time.time()
        for event in sorted(events.values(), key=lambda e: e.seq):
            for delivery in event.deliveries:
                if delivery.status in ("pending", "held"):
                    delivery.status = "pending"
                    sandbox.dispatcher.schedule([delivery], (delivery.next_attempt_at or now) - now)


class StateFile:
    """Loads the sandbox from `path` once, then keeps the file up to date until `close()`."""

    def __init__(self, sandbox: Sandbox, path: str):
        self.sandbox = sandbox
        self.path = os.path.abspath(path)
        self._written: bytes | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def load(self) -> str:
        """Read the file into the sandbox; returns one line for the terminal."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return f"no saved state at {self.path}; starting empty"
        except OSError as exc:
            return self._move_aside(f"could not be read ({exc.strerror or exc})")
        try:
            restore(self.sandbox, json.loads(raw))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self._move_aside(f"is not a state this sandbox can read ({type(exc).__name__}: {exc})")
        self._written = raw
        s = self.sandbox
        return (
            f"loaded {len(s.sessions)} sessions, {len(s.events)} events and {len(s.endpoints)} webhook "
            f"endpoints from {self.path}"
        )

    def _move_aside(self, why: str) -> str:
        aside = f"{self.path}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            return (
                f"the saved state {self.path} {why}, and could not be moved aside ({exc.strerror or exc}); "
                "starting empty, and it will be overwritten"
            )
        return f"the saved state {self.path} {why}; moved it to {aside} and started empty"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="stripe-sandbox-persist", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.save()

    def _loop(self) -> None:
        while not self._stop.wait(WRITE_EVERY):
            try:
                self.save()
            except Exception:  # a full disk must not stop the sandbox; the next change tries again
                log.exception("stripe sandbox: could not save its state to %s", self.path)

    def save(self) -> bool:
        """Write the state if it changed since the last write; True when written."""
        with self.sandbox.lock:
            data = snapshot(self.sandbox)
        raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
        if raw == self._written:
            return False
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".stripe-sandbox-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._written = raw
        return True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)
