"""`hpcbus tail SUBJECT`: `command` (subscribe, filter, print) and `decode` (one line per message)."""
