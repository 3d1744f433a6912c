"""The payment provider's adapter: every call to Stripe (`gateway.py`, over `transport.py`; the
breaker's probe and the preflight's read in `probe.py`), the guard that stands before each call
(`guard/`), what the provider says as plain values (`views.py`) and its failures (`errors.py`), a
webhook's signature (`signature.py`), webhook endpoint registration, the provider watch, the shop's
mark on its sessions and the console's links to them. The only package that imports `stripe`; it
imports no use case."""
