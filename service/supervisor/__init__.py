"""The supervisor: engine command, launch and stop, readiness, lifecycle, HTTP API, metrics."""
