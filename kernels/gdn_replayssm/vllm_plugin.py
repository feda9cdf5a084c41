"""vLLM general plugin entry point (`vllm.general_plugins`).

vLLM calls `register()` once in every process it starts. It does nothing unless
WARDEN_GDN_REPLAYSSM=1; the layer swap it will perform (vLLM's GDN layer onto this package's kernels) is
not built yet, so it refuses rather than serve without it.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

ENABLE_ENV = "WARDEN_GDN_REPLAYSSM"


def register() -> None:
    if os.environ.get(ENABLE_ENV) != "1":
        return
    raise RuntimeError(
        f"{ENABLE_ENV}=1 asks for the GDN ReplaySSM layer, but this warden build does not plug the "
        "ReplaySSM kernels into vLLM's GDN layer yet; set replayssm.enabled: false in the profile"
    )
