"""One module per measured system: a no-op handler and a latency-recording handler each."""
