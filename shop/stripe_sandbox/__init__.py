"""A Stripe-compatible sandbox server (see `server` for what it models and what it does not).

    from shop.stripe_sandbox import create_sandbox_app, run
    from shop.stripe_sandbox.testing import running_sandbox

Self-contained: it imports nothing from the rest of `shop`.
"""

from .server import create_sandbox_app, run

__all__ = ["create_sandbox_app", "run"]
