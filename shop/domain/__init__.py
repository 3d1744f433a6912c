"""The pure core: order states and guarded transitions, payment proof, restoration arithmetic
and deadline arithmetic. Nothing here imports Flask, SQLAlchemy, RQ, redis or stripe, so every
rule can be tested without a database and reused by every path (web, webhook, sweep, console).
"""
