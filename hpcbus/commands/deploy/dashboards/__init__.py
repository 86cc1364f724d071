"""What `hpcbus deploy grafana` and `hpcbus deploy influx-retention` write, as pure definitions (no I/O).

`influxql` adds the InfluxQL query type that Grafana's Python SDK (grafana-foundation-sdk) lacks, and records
the measurements queries read; `panels` holds the variables, panel kinds and dashboard frame; `overview`,
`node`, `job` and `users` are the four dashboards and `boards` lists them; `provisioning` writes the data
source and dashboard provider files; `downsampling` plans the retention policies and continuous queries for
the measurements the dashboards read; `settings` holds the `[grafana]` and `[retention]` tables. The
commands (`hpcbus/commands/deploy/grafana.py`, `influx_retention.py`) only read settings and write files or run statements;
tests import these modules to execute every query a dashboard holds against a real InfluxDB.
"""
