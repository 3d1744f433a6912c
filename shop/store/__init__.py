"""The stores: one owner for each aggregate's rows, below the use cases and above the domain.
`store.order_store` is the one module that reads an order for a decision or writes the `orders` row."""
