"""vLLM general plugin entry point (`vllm.general_plugins`).

vLLM calls `register()` once in every process it starts. It does nothing unless WARDEN_GDN_REPLAYSSM=1, which
warden sets from the profile's replayssm section with WARDEN_GDN_REPLAYSSM_RING_LEN and WARDEN_GDN_REPLAYSSM_SHADOW.
On vLLM's CPU build it routes the GDN layers' speculative verify through ReplaySSM (`vllm_cpu.py`). The layer swap
onto the Triton kernels for CUDA and XPU is not built, so there it refuses rather than serve without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENABLE_ENV = "WARDEN_GDN_REPLAYSSM"
RING_LEN_ENV = "WARDEN_GDN_REPLAYSSM_RING_LEN"
SHADOW_ENV = "WARDEN_GDN_REPLAYSSM_SHADOW"  # 1: also run vLLM's own ops and log the deviation (vllm_cpu_shadow)
DEFAULT_CPU_RING_LEN = 16


def ring_len_from_env(environ: Mapping[str, str] = os.environ) -> int:
    raw = environ.get(RING_LEN_ENV, str(DEFAULT_CPU_RING_LEN))
    try:
        ring_len = int(raw)
    except ValueError:
        ring_len = 0
    if ring_len < 2:
        raise RuntimeError(f"{RING_LEN_ENV}={raw!r} is not a ring length: set replayssm.ring_len to an integer >= 2")
    return ring_len


def register() -> None:
    if os.environ.get(ENABLE_ENV) != "1":
        return
    ring_len = ring_len_from_env()
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise RuntimeError(
            f"{ENABLE_ENV}=1 asks for the GDN ReplaySSM layer, but this warden build plugs it into vLLM's CPU build "
            "only; set replayssm.enabled: false in the profile"
        )
    from .vllm_cpu_hooks import install

    install(ring_len, shadow_check=os.environ.get(SHADOW_ENV) == "1")
