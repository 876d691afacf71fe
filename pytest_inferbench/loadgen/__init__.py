"""The load generator: workload, async HTTP client, /metrics scraping, client self-check."""
