"""`hpcbus pub`: inject data by hand, like `nats pub`, for machines without the nats CLI."""
