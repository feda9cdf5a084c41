"""Model builders: tiny random-weight hybrids for tests, real-dimension configs for planning."""
