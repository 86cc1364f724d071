"""`hpcbus produce slurm`: what the Slurm master knows about jobs and nodes, published on the bus.

One process on a node that can run `sacct`, `squeue` and `sinfo` polls them, keeps per job step the fields it
has already sent (a state file), and publishes only what is new or changed, in the mapping's forms
(docs/mapping.md sections 6 and 7): Sonar `SlurmJob` records in a JobsEnvelope on `<cluster>.events.slurm`,
cc-backend `start_job`/`stop_job` on `<cluster>.events.job`, the partitions and node states as a Sonar
ClusterEnvelope on `<cluster>.events.cluster` (and the cc-backend `nodestate` derived from it).

Modules, one job each: `settings` (options), `zone` (which time zone sacct's times are in), `poller` (runs
the commands), `state` (what was sent), `producer` (poll + state -> lines per subject), `command` (the CLI
and the service loop), `bench` (parse rate of the corpus).
"""
