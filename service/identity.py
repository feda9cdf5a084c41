"""The canonical run identity: everything that decides what a run computes and how fast, and its
sha256 fingerprint. Two runs may be compared only when their fingerprints match.

Built from the guard's facts, so engine arguments are normalized by vLLM's own parser (every
spelling of one setting gives the same identity) and configs are hashed as canonical JSON (file
formatting does not count). Fields left to the placement ("auto") stay "auto" until a caller with
a placement builds the identity.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service import __version__
from service.guard.engine_args import vllm_version
from service.guard.facts import RELEVANT_ENV_PREFIXES, GuardFacts, canonical_json
from service.guard.rules.placement import DEVICE_MASK_ENV

IDENTITY_SCHEMA = 1
KERNEL_PACKAGE = "gdn_replayssm"
# Per-run plumbing and secrets: never part of what a run computes, never exported.
_EXCLUDED_ENV = {"VLLM_RPC_BASE_PATH", "WARDEN_STATE_DIR"}
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|CREDENTIAL", re.IGNORECASE)


class IdentityUnavailable(Exception):
    """The identity cannot be built here (engine arguments unparsed, vLLM missing)."""


@dataclass(frozen=True)
class Versions:
    vllm: str | None
    warden: str
    kernel_source_sha256: str | None


def kernel_source_sha256(package: str = KERNEL_PACKAGE) -> str | None:
    """sha256 over the package's `*.py` files, sorted by relative path: path, NUL, bytes, NUL each."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def current_versions() -> Versions:
    return Versions(vllm=vllm_version(), warden=__version__, kernel_source_sha256=kernel_source_sha256())


def identity_env(env: Mapping[str, str], *, devices_known: bool) -> dict[str, str]:
    """The engine environment that belongs in the identity: relevant prefixes only, no per-run
    paths or secrets, and no device mask when the devices are a field of their own."""
    out = {}
    for name, value in env.items():
        if not name.startswith(RELEVANT_ENV_PREFIXES) or name in _EXCLUDED_ENV or _SECRET.search(name):
            continue
        if devices_known and name in DEVICE_MASK_ENV:
            continue
        out[name] = value
    return out


@dataclass(frozen=True)
class RunIdentity:
    fields: Mapping[str, Any]

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fields)

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "identity": dict(self.fields)}


def fingerprint(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(fields).encode("utf-8")).hexdigest()


def build_identity(facts: GuardFacts, *, versions: Versions | None = None) -> RunIdentity:
    """Raises IdentityUnavailable when the engine arguments could not be normalized."""
    if facts.engine_args.status != "parsed":
        raise IdentityUnavailable(
            f"the run identity needs engine.args normalized by vLLM's parser: {facts.engine_args.error}"
        )
    v = versions if versions is not None else current_versions()
    speculative = dict(facts.speculative) if facts.speculative is not None else None
    draft = None
    if speculative is not None and facts.draft is not None:
        if facts.draft.path is not None:  # a local draft: its resolved folder and content, like the model
            speculative["model"] = facts.draft.path
        draft = {"config_sha256": facts.draft.config_sha256, "weight_index_sha256": facts.draft.weight_index_sha256}
    replayssm: dict[str, Any] = {"enabled": facts.replayssm_enabled}
    if facts.replayssm_enabled:
        replayssm["ring_len"] = facts.replayssm_ring_len
    if facts.replayssm_shadow_check:  # only when on: identities recorded before the field existed stay equal
        replayssm["shadow_check"] = True
    fields = {
        "schema": IDENTITY_SCHEMA,
        "model": {
            "path": facts.model.path or facts.model.reference,
            "config_sha256": facts.model.config_sha256,
            "weight_index_sha256": facts.model.weight_index_sha256,
        },
        "vllm_version": v.vllm,
        "warden": {"version": v.warden, "kernel_source_sha256": v.kernel_source_sha256},
        "platform": facts.platform,
        "devices": list(facts.devices) if facts.devices is not None else "auto",
        "tensor_parallel": facts.tensor_parallel if facts.tensor_parallel is not None else "auto",
        "engine_args": dict(facts.engine_args.values),
        "engine_env": identity_env(facts.engine_env, devices_known=facts.devices is not None),
        "speculative": speculative,
        "draft_model": draft,
        "replayssm": replayssm,
    }
    if facts.vllm_fixes:  # only when some apply: identities off the CPU stay as they were
        fields["vllm_fixes"] = list(facts.vllm_fixes)
    # Round-trip through canonical JSON: the stored fields are exactly what the fingerprint covers.
    return RunIdentity(fields=json.loads(canonical_json(fields)))


@dataclass(frozen=True)
class Difference:
    field: str  # dotted path, e.g. engine_args.compilation_config.cudagraph_mode
    a: Any
    b: Any

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "a": self.a, "b": self.b}


_MISSING = "<absent>"


def diff_identities(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[Difference]:
    """Every leaf field whose value differs, by dotted path; a field only one side has shows the
    other side as "<absent>"."""
    out: list[Difference] = []
    for key in sorted(set(a) | set(b)):
        path = f"{prefix}{key}"
        left, right = a.get(key, _MISSING), b.get(key, _MISSING)
        if isinstance(left, Mapping) and isinstance(right, Mapping):
            out.extend(diff_identities(left, right, prefix=f"{path}."))
        elif canonical_json(left) != canonical_json(right):  # True and 1 differ, as in the fingerprint
            out.append(Difference(field=path, a=left, b=right))
    return out
