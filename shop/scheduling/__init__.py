"""Time: per-order payment deadlines (scheduled commands) and the reconciliation sweep."""
