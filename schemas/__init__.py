"""Pure wire formats of hpcbus: no I/O here, only codecs, validation and mappings.

`schemas.lineprotocol` is the ClusterCockpit flavour of InfluxDB line protocol, `schemas.sonar` the Sonar
JSON envelopes, `schemas.noderange` Slurm hostlists, `schemas.subjects` the NATS subject tree,
`schemas.ccbackend` cc-backend's job events, `schemas.message` one NATS message. Nothing here imports from
`hpcbus`, `producers` or `consumers`.
"""
