"""Payments: the Stripe gateway (the only stripe import), the guarded application of provider
facts to orders, refunds of late money, and webhook endpoint registration."""
