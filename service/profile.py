"""Profile schema v1: what one supervised vLLM deployment looks like, loaded from YAML.

The field names are a contract (tests, ops profiles and later features rely on them): fields may
be added, never renamed. Unknown fields are rejected with their path, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.errors import UserError

Platform = Literal["auto", "cuda", "xpu", "cpu", "sim"]
FaultKind = Literal["crash", "hang", "wrong-result", "device-lost", "slow-link", "alloc-fail"]
Port = Annotated[int, Field(ge=1, le=65535)]
PositiveSeconds = Annotated[float, Field(gt=0)]


def _no_nul(path: str) -> str:
    """A path with a NUL character names no file (the OS refuses it, and `Path.resolve` raises)."""
    if "\0" in path:
        raise ValueError("a path cannot contain a NUL character; remove it")
    return path


FolderPath = Annotated[str, Field(min_length=1), AfterValidator(_no_nul)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Strict):
    path: FolderPath = Field(description="folder with config.json; relative to the profile's folder")
    served_name: str | None = Field(default=None, min_length=1)


class EngineSection(_Strict):
    args: list[str] = Field(default_factory=list, description="vLLM serve arguments after the model")
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    port: Port = 8000
    vllm_fixes: bool = Field(
        default=True,
        description="warden's fixes for vLLM bugs, installed in the engine by warden's plugin (today, on the cpu "
        "platform: GDN rows of one token, the GDN spec conv after a short window); false: vLLM as shipped",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"environment variable name {name!r} is not valid")
        return env


class SpeculativeSection(BaseModel):
    """vLLM's speculative config. Keys beyond these pass through to vLLM unchanged."""

    model_config = ConfigDict(extra="allow", frozen=True)

    method: str = Field(min_length=1)
    num_speculative_tokens: int = Field(ge=1)
    model: Annotated[str, AfterValidator(_no_nul)] | None = None


def default_ring_len(num_tokens: int, max_batch: int | None = None) -> int:
    """The ring length the H200 benchmark chose for windows of `num_tokens` tokens (1 + speculative tokens):
    16 for decode, 32 for 2 tokens, 64 above, or 32 there when the engine never runs more than 8 sequences a step
    (`max_batch`: vLLM's `--max-num-seqs`; None: not capped). The same rule as `gdn_replayssm.default_ring_len`
    (service does not import the kernels; a test keeps the two equal)."""
    if num_tokens <= 1:
        return 16
    if num_tokens == 2:
        return 32
    return 32 if max_batch is not None and max_batch <= 8 else 64


class ReplaySSMSection(_Strict):
    enabled: bool = False
    # None: default_ring_len(1 + speculative.num_speculative_tokens, engine's --max-num-seqs), resolved into the
    # guard's facts
    ring_len: int | None = Field(default=None, ge=1)
    # also run vLLM's own verify beside ReplaySSM and log how far apart they are (CPU build; a diagnostic)
    shadow_check: bool = False

    @model_validator(mode="after")
    def _shadow_needs_replayssm(self) -> ReplaySSMSection:
        if self.shadow_check and not self.enabled:
            raise ValueError("shadow_check compares ReplaySSM with vLLM's verify: set enabled: true as well")
        return self


class GuardSection(_Strict):
    waive: dict[str, str] = Field(default_factory=dict, description="rule id -> reason for waiving it")

    @field_validator("waive")
    @classmethod
    def _reasons_given(cls, waive: dict[str, str]) -> dict[str, str]:
        for rule, reason in waive.items():
            if not reason.strip():
                raise ValueError(f"waiving rule {rule!r} needs a reason: write why it is safe here")
        return waive


class SimFault(_Strict):
    device: int = Field(ge=0)
    fault: FaultKind
    during: Literal["auto", "probe", "collective"] = Field(
        default="auto", description="where the fault strikes: the device probes, the all-reduce, or its default"
    )

    @model_validator(mode="after")
    def _slow_link_in_collective(self) -> SimFault:
        if self.fault == "slow-link" and self.during == "probe":
            raise ValueError("a slow link shows only in a collective: use during auto or collective")
        return self


class SimSection(_Strict):
    devices: int = Field(default=4, ge=1, le=64)
    faults: list[SimFault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _faults_on_existing_devices(self) -> SimSection:
        for fault in self.faults:
            if fault.device >= self.devices:
                raise ValueError(
                    f"fault on device {fault.device}, but the simulation has {self.devices} devices "
                    f"(0..{self.devices - 1})"
                )
        return self


class PreflightSection(_Strict):
    """Device and collective checks before every launch (see preflight/)."""

    probe_timeout_s: PositiveSeconds = Field(default=20.0, description="one device probe, then its worker is killed")
    startup_timeout_s: PositiveSeconds = Field(default=120.0, description="probe worker start + import torch")
    collective_timeout_s: PositiveSeconds = Field(default=60.0, description="one all-reduce check, init included")
    collective: bool = Field(default=True, description="all-reduce across the healthy devices (and bisect on failure)")
    min_busbw_gbps: float | None = Field(
        default=None, ge=0, description="bus-bandwidth floor in GB/s; default per platform; calibrate per host"
    )
    quarantine_file: str | None = Field(
        default=None, description="default <state root>/quarantine.json; relative to the profile's folder"
    )


class RestartSection(_Strict):
    max_restarts: int = Field(default=3, ge=0, description="relaunches before the supervisor gives up")
    backoff_initial_s: PositiveSeconds = 1.0
    backoff_max_s: PositiveSeconds = 300.0


class SupervisorSection(_Strict):
    startup_timeout_s: PositiveSeconds = Field(
        default=1200.0, description="launch to ready; large MoE models take many minutes"
    )
    stop_grace_s: PositiveSeconds = Field(default=10.0, description="SIGTERM to SIGKILL")
    reap_timeout_s: PositiveSeconds = Field(default=60.0, description="SIGKILL to no process left")
    probe_interval_s: PositiveSeconds = 1.0
    request_timeout_s: PositiveSeconds = Field(default=30.0, description="one readiness HTTP call")
    canary_prompt: str = Field(
        default="The supervisor checks that the engine generates real tokens before it reports ready.",
        min_length=8,
    )
    canary_max_tokens: int = Field(default=8, ge=1, le=256)
    liveness_interval_s: PositiveSeconds = Field(
        default=30.0, description="while ready: one canary completion this often (a wedged engine keeps /health 200)"
    )
    liveness_failures: int = Field(default=3, ge=1, description="consecutive failed canaries that mean hung")
    state_dir: str | None = Field(
        default=None, description="engine logs and state; default $WARDEN_STATE_DIR or ~/.local/state/warden"
    )
    restart: RestartSection = Field(default_factory=RestartSection)


class ApiSection(_Strict):
    host: str = "127.0.0.1"
    port: Port = 9400
    token_file: str | None = None


class Profile(_Strict):
    name: str = Field(min_length=1)
    model: ModelSection
    platform: Platform = "auto"
    devices: Literal["auto"] | list[Annotated[int, Field(ge=0)]] = "auto"
    tensor_parallel: Literal["auto"] | Annotated[int, Field(ge=1)] = "auto"
    engine: EngineSection = Field(default_factory=EngineSection)
    speculative: SpeculativeSection | None = None
    replayssm: ReplaySSMSection = Field(default_factory=ReplaySSMSection)
    guard: GuardSection = Field(default_factory=GuardSection)
    sim: SimSection = Field(default_factory=SimSection)
    preflight: PreflightSection = Field(default_factory=PreflightSection)
    supervisor: SupervisorSection = Field(default_factory=SupervisorSection)
    api: ApiSection = Field(default_factory=ApiSection)

    @field_validator("name")
    @classmethod
    def _name_is_a_label(cls, name: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError("use letters, digits, '.', '_' and '-' only, starting with a letter or digit")
        return name

    @field_validator("devices")
    @classmethod
    def _devices_unique(cls, devices: Literal["auto"] | list[int]) -> Literal["auto"] | list[int]:
        if isinstance(devices, list):
            if not devices:
                raise ValueError("list no device indices, or write 'auto'")
            if len(set(devices)) != len(devices):
                raise ValueError(f"device indices repeat: {devices}")
        return devices

    @model_validator(mode="after")
    def _ports_distinct(self) -> Profile:
        if self.engine.port == self.api.port and self.engine.host == self.api.host:
            raise ValueError(
                f"engine.port and api.port are both {self.api.port} on {self.api.host}; give them different ports"
            )
        return self


class LoadedProfile(BaseModel):
    """A validated profile and where it came from; paths in it resolve against `source.parent`."""

    model_config = ConfigDict(frozen=True)

    profile: Profile
    source: Path

    @property
    def model_dir(self) -> Path:
        return self.resolve(self.profile.model.path)

    @property
    def served_name(self) -> str:
        return self.profile.model.served_name or self.profile.name

    def resolve(self, relative: str) -> Path:
        """A path as the profile writes it: `~` expanded, relative to the profile's folder. `~name` of no known user
        stays as written (the folder is then missing, which the model checks report by field)."""
        path = Path(relative)
        with contextlib.suppress(RuntimeError):
            path = path.expanduser()
        return path if path.is_absolute() else (self.source.parent / path).resolve()


# a wildcard bind, and the loopback address that reaches it (read here, never bound)
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104


def reachable_url(host: str, port: int) -> str:
    """`http://host:port` for a client on this host: a wildcard bind is reached on loopback, IPv6 in brackets."""
    host = _WILDCARDS.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _format_location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            # pydantic reports union branches as extra location parts; they mean nothing to a user.
            if item in {"list[int]", "literal['auto']", "int", "function-after[_devices_unique(), union]"}:
                continue
            if item.startswith(("literal[", "constrained-int", "list[")):
                continue
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(top level)"


def describe_validation_error(error: ValidationError, source: Path) -> str:
    """One line per field: its path, what is wrong, and what was given. Union fields (e.g.
    `devices: auto | [int]`) report every alternative on one line."""
    by_field: dict[str, list[str]] = {}
    for problem in error.errors():
        where = _format_location(tuple(problem["loc"]))
        if problem["type"] == "extra_forbidden":
            message = "unknown field (check its spelling against the profile schema in README.md)"
        else:
            message = problem["msg"].removeprefix("Value error, ")
            given = problem.get("input")
            if problem["type"] != "missing" and not isinstance(given, dict | list):
                message += f" (given: {given!r})"
        messages = by_field.setdefault(where, [])
        if message not in messages:
            messages.append(message)
    lines = [f"  {where}: {'; or: '.join(messages)}" for where, messages in by_field.items()]
    return f"profile {source} is not valid:\n" + "\n".join(lines)


def parse_profile(data: Any, source: Path) -> LoadedProfile:
    if not isinstance(data, dict):
        raise UserError(
            f"profile {source} must be a YAML mapping at the top level, found {type(data).__name__}",
            "start the file with `name: ...` and `model: {path: ...}`; see ops/profiles/tiny-cpu.yaml",
        )
    try:
        profile = Profile.model_validate(data)
    except ValidationError as error:
        raise UserError(
            describe_validation_error(error, source),
            "fix the fields named above; ops/profiles/tiny-cpu.yaml is a complete example",
        ) from None
    return LoadedProfile(profile=profile, source=source.resolve())


def load_profile(path: str | Path) -> LoadedProfile:
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"profile {source} does not exist", "pass the path of a profile YAML file") from None
    except OSError as error:
        raise UserError(
            f"profile {source} cannot be read: {error.strerror}", "check the path and its permissions"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise UserError(f"profile {source} is not valid YAML{where}", "fix the YAML syntax there") from None
    return parse_profile(data, source)


def profile_ring_len(profile: Profile, max_batch: int | None = None) -> int:
    """The ReplaySSM ring a profile runs with: `replayssm.ring_len`, or when it is left out the measured default
    for the profile's verify window (1 + speculative tokens) and, when known, the most rows a step runs."""
    if profile.replayssm.ring_len is not None:
        return profile.replayssm.ring_len
    spec = profile.speculative
    return default_ring_len(1 + (spec.num_speculative_tokens if spec is not None else 0), max_batch)


# warden's fixes for vLLM bugs, installed in the engine by its plugin (kernels/gdn_replayssm/vllm_cpu_fixes.py FIXES;
# a test keeps the names equal): what the run identity records and what turns them on
FIX_SIZE_ONE_STRIDES = "cpu-gdn-one-token-rows"
FIX_SPEC_CONV_HISTORY = "cpu-gdn-spec-conv-history"
CPU_VLLM_FIXES = (FIX_SIZE_ONE_STRIDES, FIX_SPEC_CONV_HISTORY)


def engine_fixes(profile: Profile, platform: str) -> tuple[str, ...]:
    """The fixes the engine gets on `platform` (vLLM's CPU build serves cpu and sim)."""
    return CPU_VLLM_FIXES if profile.engine.vllm_fixes and platform in ("cpu", "sim") else ()
