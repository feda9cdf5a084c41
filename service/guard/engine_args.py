"""Engine arguments as vLLM itself reads them, reduced to the values that differ from its defaults.

`vllm serve` parses its arguments with `FlexibleArgumentParser`, which accepts many spellings of
one setting (`-cc.cudagraph_mode=PIECEWISE` and `--compilation-config '{"cudagraph_mode": ...}'`,
`-O3` and `--optimization-level 3`, `--enforce_eager` and `--enforce-eager`, `64M` and
`67108864`). Parsing with the same parser and keeping only what differs from a parse of no
arguments gives one normalized form, so rules and the run identity see every spelling alike.

vLLM is imported lazily, here only, and at most once per process. Without it the result says
`unavailable`; rules that need arguments then report `unknown`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import logging
import math
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal, NoReturn

ArgsStatus = Literal["parsed", "invalid", "unavailable"]

# The positional model argument; warden passes the real model itself (engine_command owns --model).
PLACEHOLDER_MODEL = "warden-model-placeholder"
_IGNORED_DESTS = frozenset({"model_tag"})
_REMOVED = "<removed>"


class FactUnavailable(Exception):
    """A fact a rule needs is missing; the evaluator turns this into an `unknown` finding."""


@dataclass(frozen=True)
class EngineArgsFacts:
    """engine.args normalized: `values` maps vLLM's option names (dest form, e.g.
    `compilation_config`) to plain JSON values that differ from vLLM's defaults."""

    status: ArgsStatus
    raw: tuple[str, ...]
    values: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    def require(self) -> Mapping[str, Any]:
        if self.status == "parsed":
            return self.values
        if self.status == "invalid":
            raise FactUnavailable(f"vLLM's argument parser rejects engine.args ({self.error})")
        raise FactUnavailable(f"engine.args could not be parsed: {self.error}")


class _ParserRejected(Exception):
    pass


def _reject(message: str) -> NoReturn:
    raise _ParserRejected(message)


@dataclass(frozen=True)
class _Loaded:
    parser: Any
    raw_defaults: Mapping[str, Any]  # the parser's own default objects (enums, config dataclasses)
    defaults: Mapping[str, Any]  # the same as plain JSON values
    version: str


_LOCK = threading.Lock()
_STATE: _Loaded | str | None = None  # loaded parser, or why vLLM could not be loaded


def _load() -> _Loaded | str:
    """Import vLLM and build its serve parser once per process (about 10 s of imports)."""
    global _STATE  # noqa: PLW0603 - a per-process cache of an expensive import
    with _LOCK:
        if _STATE is not None:
            return _STATE
        try:
            # vLLM configures its log handler on import, binding it to the current sys.stdout;
            # bind it to stderr so `--json` output on stdout stays clean.
            with contextlib.redirect_stdout(sys.stderr):
                vllm = importlib.import_module("vllm")
                argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
                cli_args = importlib.import_module("vllm.entrypoints.launchers.cli_args")
                parser = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm serve"))
                parser.error = _reject  # argparse calls self.error(); raise instead of exiting the process
                with _quiet():
                    raw_defaults = dict(vars(parser.parse_args([PLACEHOLDER_MODEL])))
            _STATE = _Loaded(
                parser=parser,
                raw_defaults=raw_defaults,
                defaults=_plain_namespace(raw_defaults, raw_defaults),
                version=str(vllm.__version__),
            )
        except Exception as error:  # any failure to import or build means "no parser here"
            _STATE = f"vLLM is not importable here ({type(error).__name__}: {error})"
        return _STATE


def vllm_available() -> bool:
    return isinstance(_load(), _Loaded)


def vllm_version() -> str | None:
    state = _load()
    return state.version if isinstance(state, _Loaded) else None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence vLLM's own logging (deprecation and duplicate-key warnings) while parsing."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _asks_for_help(arg: str) -> bool:
    """`--help`, `-h`, `--version` and the abbreviations argparse accepts for them (`--hel`): parsing
    those would print to stdout and exit, so they are refused before parsing."""
    if arg == "-h":
        return True
    name = arg.split("=", 1)[0]
    return len(name) >= 3 and name.startswith("--") and ("--help".startswith(name) or "--version".startswith(name))


def normalize_engine_args(args: Sequence[str]) -> EngineArgsFacts:
    """Parse `args` as `vllm serve MODEL *args` does; never raises."""
    raw = tuple(str(a) for a in args)
    state = _load()
    if isinstance(state, str):
        return EngineArgsFacts(status="unavailable", raw=raw, error=state)
    if any(_asks_for_help(a) for a in raw):
        return EngineArgsFacts(status="invalid", raw=raw, error="engine.args asks vLLM for help or its version")
    with _LOCK, _quiet():
        try:
            namespace = state.parser.parse_args([PLACEHOLDER_MODEL, *raw])
        except _ParserRejected as error:
            return EngineArgsFacts(status="invalid", raw=raw, error=str(error))
        except SystemExit:  # only help and version actions exit, and they are refused above
            return EngineArgsFacts(status="invalid", raw=raw, error="vLLM's parser exited")
        except Exception as error:
            return EngineArgsFacts(status="invalid", raw=raw, error=f"{type(error).__name__}: {error}")
    try:
        values = diff_from_defaults(_plain_namespace(vars(namespace), state.raw_defaults), state.defaults)
        values = _fold_capture_sizes(values)
    except ValueError as error:
        return EngineArgsFacts(status="invalid", raw=raw, error=str(error))
    return EngineArgsFacts(status="parsed", raw=raw, values=values)


def _fold_capture_sizes(values: dict[str, Any]) -> dict[str, Any]:
    """`--max-cudagraph-capture-size` and `--cudagraph-capture-sizes` are spellings of the
    compilation config's fields; vLLM merges them at engine creation and rejects both at once."""
    out = dict(values)
    for name in ("max_cudagraph_capture_size", "cudagraph_capture_sizes"):
        if name not in out:
            continue
        value = out.pop(name)
        compilation = dict(out.get("compilation_config") or {})
        if name in compilation:
            raise ValueError(f"--{name.replace('_', '-')} and compilation_config.{name} are mutually exclusive")
        compilation[name] = value
        out["compilation_config"] = compilation
    return out


# ---- plain JSON values -------------------------------------------------------------------


def _coerce_like(value: Any, default: Any) -> Any:
    """Parse-time strings for enum options (`-O3` gives "3") as the enum vLLM will use."""
    if isinstance(default, enum.Enum) and not isinstance(value, enum.Enum):
        kind = type(default)
        for candidate in (value, _maybe_int(value)):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                return kind(candidate)
        if isinstance(value, str):
            with contextlib.suppress(KeyError):
                return kind[value.upper()]
    return value


def _maybe_int(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def to_plain(value: Any) -> Any:
    """A JSON value for anything the parser produces: enums by name, config dataclasses as
    objects, sets as sorted lists, non-finite floats as strings."""
    if isinstance(value, enum.Enum):  # before int and str: IntEnum and StrEnum are both
        return value.name
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name, None)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((to_plain(v) for v in value), key=repr)
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return to_plain(dump(mode="json"))
    return f"<{type(value).__name__}>"


def _plain_namespace(namespace: Mapping[str, Any], raw_defaults: Mapping[str, Any]) -> dict[str, Any]:
    return {k: to_plain(_coerce_like(v, raw_defaults.get(k))) for k, v in namespace.items() if k not in _IGNORED_DESTS}


def diff_from_defaults(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `values` that differ from `defaults`; nested objects are compared field by
    field, so `{"cudagraph_mode": "PIECEWISE"}` is what remains of a whole compilation config."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in defaults:
            out[key] = value
            continue
        default = defaults[key]
        if isinstance(value, dict) and isinstance(default, dict):
            nested = diff_from_defaults(value, default)
            removed = {k: _REMOVED for k in default if k not in value}
            if nested or removed:
                out[key] = {**removed, **nested}
        elif value != default:
            out[key] = value
    return out
