"""`hpcbus consume influx`: the bus into InfluxDB, acknowledged only after InfluxDB accepted the points."""
