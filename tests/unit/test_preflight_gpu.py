"""The cuda backend for real: quick and full preflight on the GPUs of this host (marker `gpu`).

Skipped where no NVIDIA driver is present. Writes each report to $WARDEN_PREFLIGHT_REPORT_DIR
(else the test's temporary folder) as `preflight-cuda-<level>.json`. The same runs without pytest:
`PYTHONPATH=. python -m preflight.bench --platform cuda --level quick --level full --out DIR`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from preflight.health import Health
from preflight.levels import Level, probes_for
from preflight.orchestrate import PreflightOptions, run_preflight
from preflight.platforms import resolve_platform
from preflight.report import render_text

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(resolve_platform("auto") != "cuda", reason="needs an NVIDIA driver (/dev/nvidiactl)"),
]


@pytest.mark.parametrize("level", ["quick", "full"])
def test_cuda_preflight_on_this_host(level: Level, tmp_path: Path) -> None:
    report = run_preflight(PreflightOptions(platform="cuda", level=level))
    out = Path(os.environ.get("WARDEN_PREFLIGHT_REPORT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"preflight-cuda-{level}.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    text = render_text(report)

    assert report.devices, text
    assert report.discovery["count"] == len(report.devices)
    for device in report.devices:
        assert device.health in (Health.HEALTHY, Health.DEGRADED), text
        checks = {p.check: p for p in device.probes}
        assert set(checks) == set(probes_for("cuda")), text
        for name in ("enumerate", "allocate", "copy", "compute", "graph"):
            assert checks[name].health is Health.HEALTHY, f"{name}: {checks[name].reason}"
        assert checks["counters"].health is not Health.UNHEALTHY, checks["counters"].reason
    if len(report.devices) >= 2:
        assert report.collective.ok is True, report.collective.reason
        assert report.collective.busbw_gbps is not None and report.collective.busbw_gbps > 0
    else:
        assert report.collective.ok is None
    assert report.placement.ok, report.placement.reason
