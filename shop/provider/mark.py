"""The shop's mark on its own Checkout Sessions (`metadata.shop`), so that money for a session that
names no order this database knows is refunded only when the session is this shop's: a provider
account is often shared with other integrations (or another Backstop), whose payments this shop
must never touch.

The mark is derived from the shop's `SECRET_KEY` (a keyed hash, which tells nothing of the key):
a copy of the database restored under the same deployment has the same mark (the sessions of the
orders it lost are still its own), while another shop has another. It needs no database read, so
it can be asked for inside any transaction. A shop that rotates `SECRET_KEY` gets a new mark:
money for an unknown order through a session made before the rotation is then left to an
operator, never refunded blindly."""

from __future__ import annotations

import hashlib
import hmac

from flask import current_app


def shop_mark() -> str:
    secret = str(current_app.config.get("SECRET_KEY") or "")
    return "bk_" + hmac.new(secret.encode(), b"backstop: this shop's payment pages", hashlib.sha256).hexdigest()[:16]
