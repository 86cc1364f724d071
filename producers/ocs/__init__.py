"""`hpcbus produce ocs`: follow an Open Cluster Scheduler / Grid Engine accounting file onto the bus.

Grid Engine writes one accounting line when a job (array task, PE task) ends and nothing else about it, so
the accounting file is the only source of finished-job facts on such a cluster. `follow` tails the file
(rotation, truncation, partial lines, restart offsets), `mapping` turns records into a Sonar jobs envelope and
cc-backend `stop_job` events (pure), `pipeline` turns one read chunk into NATS messages with deterministic
ids, and `command` runs it all once (`--once`) or as a service.
"""
