"""Device and collective health before launch, placement on the healthy devices, quarantine, and
the environment that confines the engine to the chosen devices.

Entry points (import them from their modules; this package's own import stays light because every
probe worker imports it):
- `preflight.orchestrate.run_preflight(PreflightOptions(...))`: one run, no profile needed;
- `preflight.profiles.preflight_for_profile(loaded, level=...)`: the run `warden run` makes;
- `preflight.metrics.PreflightMetrics(registry)`: the metrics, on the caller's registry;
- `preflight.cli`: `warden preflight`, also `python -m preflight` on hosts with torch only.
"""

from preflight.health import Action, CheckResult, Health
from preflight.platforms import device_environment, resolve_platform

__all__ = ["Action", "CheckResult", "Health", "device_environment", "resolve_platform"]
