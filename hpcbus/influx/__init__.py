"""The InfluxDB client every layer above shares: its settings (`[influx]`), the writer (`consume influx`,
`consume jobs`, the gateway) and InfluxQL queries (`hpcbus report`, `status`, `retention`). Runtime, so that
producers, consumers and commands can all use it without pointing sideways or up."""
