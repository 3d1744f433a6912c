"""A "did you mean" at checkout for the common misspellings of an email address's domain
(docs/REFERENCE.md, Storefront: POST /checkout): `ann@gmial.com` comes back once with
`ann@gmail.com` suggested and both choices, either of which places the order. The table is
fixed; nothing is looked up on the network, and an address typed on purpose is kept."""

from __future__ import annotations

from ..web.answers import wants_json
from .cart import render_cart

# Misspelled domain -> the one meant. Only domains no one uses on purpose: `gmail.co` is a typo,
# `example.co` (a real country domain) is not listed.
DOMAIN_TYPOS = {
    "example.con": "example.com",
    "gmial.com": "gmail.com",
    "gmai.com": "gmail.com",
    "gmal.com": "gmail.com",
    "gnail.com": "gmail.com",
    "gmail.co": "gmail.com",
    "gmail.con": "gmail.com",
    "gmail.cm": "gmail.com",
    "googlemail.co": "googlemail.com",
    "hotmial.com": "hotmail.com",
    "hotmal.com": "hotmail.com",
    "hotmai.com": "hotmail.com",
    "hotmail.co": "hotmail.com",
    "hotmail.con": "hotmail.com",
    "yaho.com": "yahoo.com",
    "yahooo.com": "yahoo.com",
    "yahoo.co": "yahoo.com",
    "yahoo.con": "yahoo.com",
    "outlok.com": "outlook.com",
    "outloo.com": "outlook.com",
    "outlook.co": "outlook.com",
    "outlook.con": "outlook.com",
    "iclod.com": "icloud.com",
    "icloud.co": "icloud.com",
    "icloud.con": "icloud.com",
}
# Misspelled endings of any domain -> the one meant (`shop.con` -> `shop.com`).
ENDING_TYPOS = {".con": ".com", ".cmo": ".com", ".ocm": ".com", ".comm": ".com", ".nte": ".net", ".ogr": ".org"}

SUGGESTION = "Did you mean {suggested}? Choose the address your receipt should go to."


def suggested_email(email: str) -> str | None:
    """The address probably meant, when `email`'s domain is a known misspelling; else None."""
    local, at, domain = email.strip().rpartition("@")
    if not at:
        return None
    lowered = domain.lower()
    meant = DOMAIN_TYPOS.get(lowered)
    if meant is None:
        ending = next((e for e in ENDING_TYPOS if lowered.endswith(e)), None)
        meant = lowered.removesuffix(ending) + ENDING_TYPOS[ending] if ending else None
    return f"{local}@{meant}" if meant else None


def typo_hint(form):
    """The cart page asking "did you mean", for a checkout whose address has a known misspelled
    domain that the customer has not already chosen to keep (the form's `kept_email`); None to go on."""
    email = (form.email.data or "").strip()
    suggested = suggested_email(email)
    kept = (form.kept_email.data or "").strip().lower()
    # A person's page asks; a JSON client (a script, an integration) is never held up by a guess.
    if suggested is None or kept == email.lower() or wants_json():
        return None
    return render_cart(
        400,
        SUGGESTION.format(suggested=suggested),
        form=form,
        field="email-typo",
        suggestion={"typed": email, "suggested": suggested},
    )
