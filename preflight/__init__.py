"""Device and collective health before launch, and the environment that confines the engine to
the chosen devices. This package grows into the platform backends (cuda, xpu, cpu, sim)."""

from preflight.platforms import device_environment, resolve_platform

__all__ = ["device_environment", "resolve_platform"]
