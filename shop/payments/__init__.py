"""Payments, the money use cases: starting a payment and its line, applying what the provider
says to orders, refunds of late money, money for unknown orders and replayed events. Every call
to the provider goes through shop.provider."""
