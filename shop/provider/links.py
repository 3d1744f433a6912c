"""Where an operator sees a payment session at the provider: Stripe's Dashboard for a Stripe key
(`/test/...` for a test key, without it for a live one), the hosted page itself for the sandbox
(it has no dashboard; its page shows the session's state)."""

from __future__ import annotations

from flask import current_app

STRIPE_DASHBOARD = "https://dashboard.stripe.com"


def session_link(session_id: str | None, hosted_url: str | None) -> dict | None:
    """{"url", "label"} for the console's order page, or None without a session."""
    if not session_id:
        return None
    cfg = current_app.config
    key = cfg.get("STRIPE_SECRET_KEY") or ""
    talks_to_stripe = key and not cfg.get("STRIPE_API_BASE")
    if talks_to_stripe and key.startswith(("sk_live_", "rk_live_")):
        return {"url": f"{STRIPE_DASHBOARD}/checkout/sessions/{session_id}", "label": "Open in Stripe's Dashboard"}
    if talks_to_stripe:
        return {
            "url": f"{STRIPE_DASHBOARD}/test/checkout/sessions/{session_id}",
            "label": "Open in Stripe's Dashboard (test mode)",
        }
    if hosted_url:
        return {"url": hosted_url, "label": "Open the session's hosted page (sandbox)"}
    return None
