"""A run's figures in the formats monitoring systems take: InfluxDB line protocol,
Graylog GELF, ReFrame-style perflog lines and CSV (``hpcmem export``)."""
