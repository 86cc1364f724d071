"""`hpcbus deadletter list|replay`: what the workers rejected, kept with its original payload."""
