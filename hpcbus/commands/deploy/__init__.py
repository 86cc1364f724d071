"""`hpcbus deploy ...`: what the commands write for the services around hpcbus: NATS identities
(`nats_auth`), Grafana's data source, dashboards and provider (`grafana`), InfluxDB's retention policies and
continuous queries (`influx_retention`), the influxdb.conf settings the schema needs (`influxdb`). `dashboards` holds the definitions the last two share."""
