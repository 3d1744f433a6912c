"""Order use cases: checkout (place_order), the customer's cancel and the payment deadline."""
