"""The sweep's passes, each over one kind of stuck order, one order per transaction:
`expiry` (unpaid orders), `provider` (orders waiting at the provider, one at a time),
`in_doubt` (many of them at once, from the provider's event list) and `late_money`
(cancelled orders whose session could still take money)."""
