"""vLLM general plugin entry point (`vllm.general_plugins`).

vLLM calls `register()` once in every process it starts. It does nothing unless warden's switches are set:

- WARDEN_VLLM_CPU_FIXES=1 (warden sets it on the cpu platform unless the profile's `engine.vllm_fixes` is false):
  fixes for vLLM CPU GDN bugs that kill the engine on one-token rows (`vllm_cpu_fixes.py`); ignored off the CPU.
- WARDEN_GDN_REPLAYSSM=1, from the profile's replayssm section with WARDEN_GDN_REPLAYSSM_RING_LEN and
  WARDEN_GDN_REPLAYSSM_SHADOW: on vLLM's CPU build the GDN layers' decode and speculative verify go through
  ReplaySSM (`vllm_cpu.py`). The layer swap onto the Triton kernels for CUDA and XPU is not built, so there it
  refuses rather than serve without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENABLE_ENV = "WARDEN_GDN_REPLAYSSM"
FIXES_ENV = "WARDEN_VLLM_CPU_FIXES"
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
    fixes, replayssm = os.environ.get(FIXES_ENV) == "1", os.environ.get(ENABLE_ENV) == "1"
    if not (fixes or replayssm):
        return
    from vllm.platforms import current_platform

    if fixes and current_platform.is_cpu():  # first: ReplaySSM's hooks then wrap the fixed ops
        from .vllm_cpu_fixes import install as install_fixes

        install_fixes()
    if not replayssm:
        return
    ring_len = ring_len_from_env()
    if not current_platform.is_cpu():
        raise RuntimeError(
            f"{ENABLE_ENV}=1 asks for the GDN ReplaySSM layer, but this warden build plugs it into vLLM's CPU build "
            "only; set replayssm.enabled: false in the profile"
        )
    from .vllm_cpu_hooks import install

    install(ring_len, shadow_check=os.environ.get(SHADOW_ENV) == "1")
