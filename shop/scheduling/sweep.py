"""Placeholder until the reconciliation sweep lands (issue 5)."""
