"""The signed session cookie, sent again only when it changed or is a day old.

Flask re-signs and re-sends a permanent session's cookie on every request, so that its expiry
slides with each visit: a serialisation, an HMAC and a Set-Cookie header per answer, about a
twentieth of the web's CPU on a customer's journey (bench/journey_cpu.py), for an expiry that
moves by seconds. Here an unchanged cookie is sent again once it was signed more than
REFRESH_AFTER ago: the expiry still slides for a browser that keeps coming back (a customer's
orders stay theirs), a day late at most against a lifetime of weeks. A changed session (a new
browser id, an operator's login, the console's idle stamp) is sent at once, as before.

The age is the signature's own timestamp, read when the cookie is opened. The signatures'
times, their expiry and the age are all on the shop's clock (shop/clock.py), so a test moves it
instead of waiting a day."""

from __future__ import annotations

from datetime import timedelta

from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from itsdangerous import BadSignature, TimestampSigner, URLSafeTimedSerializer

from .. import clock

REFRESH_AFTER = timedelta(days=1)


class SignedSession(SecureCookieSession):
    """A session with the time its cookie was signed (epoch seconds; None for a new one)."""

    signed_at: float | None = None


class ShopClockSigner(TimestampSigner):
    """itsdangerous's timestamped signer, its time read from the shop's clock."""

    def get_timestamp(self) -> int:
        return int(clock.current().time())


class DailyRefreshSessionInterface(SecureCookieSessionInterface):
    session_class = SignedSession

    def get_signing_serializer(self, app) -> URLSafeTimedSerializer | None:
        serializer = super().get_signing_serializer(app)
        if serializer is not None:
            serializer.signer = ShopClockSigner
        return serializer

    def open_session(self, app, request) -> SignedSession | None:
        signer = self.get_signing_serializer(app)
        if signer is None:
            return None
        value = request.cookies.get(self.get_cookie_name(app))
        if not value:
            return self.session_class()
        max_age = int(app.permanent_session_lifetime.total_seconds())
        try:
            data, signed_at = signer.loads(value, max_age=max_age, return_timestamp=True)
        except BadSignature:
            return self.session_class()
        session = self.session_class(data)
        session.signed_at = signed_at.timestamp()
        return session

    def should_set_cookie(self, app, session) -> bool:
        if session.modified:
            return True
        if not (session.permanent and app.config["SESSION_REFRESH_EACH_REQUEST"]):
            return False
        signed_at = getattr(session, "signed_at", None)
        return signed_at is None or clock.current().time() - signed_at >= REFRESH_AFTER.total_seconds()
