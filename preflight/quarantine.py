"""Quarantine: devices preflight found bad stay out until an operator clears them.

One JSON file per host (devices are physical; every profile on the host shares it), keyed by
platform and device index, written atomically. `warden preflight --clear DEVICE` removes an entry.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FILE_NAME = "quarantine.json"
VERSION = 1


class QuarantineError(ValueError):
    """The quarantine file exists but cannot be read as one (never silently treated as empty)."""


@dataclass(frozen=True)
class Entry:
    platform: str
    device: int
    reason: str
    failure: str | None
    since: str  # ISO 8601, UTC
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_state_root(env: dict[str, str] | None = None) -> Path:
    """$WARDEN_STATE_DIR, else ~/.local/state/warden (the supervisor's default state root)."""
    environ = os.environ if env is None else env
    configured = environ.get("WARDEN_STATE_DIR")
    return Path(configured) if configured else Path.home() / ".local" / "state" / "warden"


class Quarantine:
    def __init__(self, path: Path | None, wall_clock: Callable[[], float] = time.time) -> None:
        """`path` None: quarantine disabled (nothing read, nothing written)."""
        self.path = path
        self._wall_clock = wall_clock

    def _read(self) -> list[Entry]:
        if self.path is None or not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return [Entry(**item) for item in data["devices"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise QuarantineError(f"quarantine file {self.path} cannot be read: {error}") from None

    def _write(self, entries: list[Entry]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"version": VERSION, "devices": [e.to_dict() for e in sorted(entries, key=_key)]}
        fd, tmp = tempfile.mkstemp(prefix=".quarantine-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(payload, handle, indent=2)
                handle.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def entries(self, platform: str | None = None) -> list[Entry]:
        return [e for e in self._read() if platform is None or e.platform == platform]

    def get(self, platform: str, device: int) -> Entry | None:
        return next((e for e in self.entries(platform) if e.device == device), None)

    def add(self, platform: str, device: int, reason: str, failure: str | None, name: str | None = None) -> Entry:
        entries = self._read()
        existing = next((e for e in entries if e.platform == platform and e.device == device), None)
        if existing is not None:
            return existing  # keep the first reason and time
        since = datetime.fromtimestamp(self._wall_clock(), UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        entry = Entry(platform, device, reason, failure, since, name)
        self._write([*entries, entry])
        return entry

    def clear(self, platform: str | None, device: int | None) -> list[Entry]:
        """Remove `device` (None: every device) on `platform` (None: every platform); returns them."""
        entries = self._read()

        def matches(e: Entry) -> bool:
            return (platform is None or e.platform == platform) and (device is None or e.device == device)

        removed = [e for e in entries if matches(e)]
        if removed:
            self._write([e for e in entries if not matches(e)])
        return removed

    def describe(self, platform: str) -> dict[str, Any]:
        return {
            "path": None if self.path is None else str(self.path),
            "entries": [e.to_dict() for e in self.entries(platform)],
        }


def _key(entry: Entry) -> tuple[str, int]:
    return (entry.platform, entry.device)
