"""warden's supervisor: profile schema, engine launch, readiness, lifecycle, HTTP API and metrics."""

__all__ = ["__version__"]

__version__ = "0.1.0"
