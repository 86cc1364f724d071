"""`hpcbus status` (one screen of health facts, or a live view with `--watch`) and what it is made of:
`settings` (its options), `connect` (a one-shot connection that never hangs), `scan` (reading a stretch of
a stream without a durable), `gather` (the facts from the bus), `nodes` and `workers` (what samples and
self-telemetry say), `health` (the verdict), `render` (text), `live` (the refreshing view)."""
