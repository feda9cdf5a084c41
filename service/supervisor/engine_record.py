"""The record a supervisor keeps of the engine it runs (`<state dir>/engine.json`).

A supervisor that dies without stopping its engine (kill -9, the OOM killer, a crash) leaves vLLM's API server,
EngineCore and workers running, holding the port and the devices. The record lets the next `warden run` of the
profile, or `warden reap`, find exactly those processes: every launch puts a random marker into the engine's
environment (`WARDEN_ENGINE_ID`), which every process vLLM starts inherits. A process is the engine's when its
environment carries the marker and it was created no earlier than the engine's first process: never by name, and a
reused pid carries no marker.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

MARKER_ENV = "WARDEN_ENGINE_ID"
RECORD_NAME = "engine.json"


_JSON_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float)}


class RecordError(ValueError):
    """An engine record that cannot be read or does not hold what a supervisor writes."""


@dataclass(frozen=True)
class EngineRecord:
    profile: str
    marker: str
    engine_pid: int
    engine_start_ticks: int
    supervisor_pid: int
    supervisor_start_ticks: int
    boot_id: str
    launched_at: float  # wall clock, seconds since the epoch
    uid: int  # the supervisor's user: only it (or root) can read its engine's environments

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> EngineRecord:
        if not isinstance(data, dict):
            raise RecordError("not a JSON object")
        values: dict[str, Any] = {}
        for spec in fields(cls):
            value: Any = data.get(spec.name)
            kind = _JSON_TYPES[str(spec.type)]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise RecordError(f"field {spec.name!r} is missing or not a {spec.type}")
            values[spec.name] = value
        if not values["marker"]:
            raise RecordError("field 'marker' is empty")
        return cls(**values)


def new_marker() -> str:
    return secrets.token_hex(16)


def write_record(path: Path, record: EngineRecord) -> None:
    """Replace the record atomically: a reader sees the old one or the new one, never half of either."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(record.to_json(), indent=1) + "\n", encoding="utf-8")
    partial.replace(path)


def read_record(path: Path) -> EngineRecord | None:
    """The record at `path`, or None when there is none. Raises RecordError when it is there but unusable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RecordError(f"cannot read it: {error.strerror}") from None
    try:
        return EngineRecord.from_json(json.loads(text))
    except json.JSONDecodeError as error:
        raise RecordError(f"not JSON ({error.msg} at line {error.lineno})") from None


def remove_record(path: Path) -> None:
    path.unlink(missing_ok=True)
