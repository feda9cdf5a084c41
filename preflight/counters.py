"""Health counters: what the driver knows about a device (ECC, retired or remapped memory, Xid,
temperature, processes holding it), read through NVML, `nvidia-smi` or `xpu-smi`.

Every source is optional. NVML comes from `nvidia-ml-py` (the `cuda` extra), imported only here and
only when asked for; without it `nvidia-smi` is tried; without either the result is `unknown` with
the reason, never `healthy`. External tools run under a timeout (see `commands`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from preflight.commands import DEFAULT_COMMAND_TIMEOUT_S, CommandRunner, run_command
from preflight.health import Action, CheckResult, Health, plural

# gpud's catalogue: Xids after which the GPU needs a reset or replacement.
FATAL_XIDS = frozenset({48, 61, 62, 63, 64, 69, 74, 79, 94, 95, 119, 120, 140})
HOT_CELSIUS = 85  # xpumd's GpuTemperatureHigh and the anchors' red line
KMSG_MAX_RECORDS = 200_000
NVIDIA_COUNTERS = (
    "ecc_uncorrected",
    "retired_pages_pending",
    "remapped_rows_pending",
    "remap_failure",
    "temperature_c",
    "xids",
    "holders",
)


@dataclass(frozen=True)
class Holder:
    """A process holding a device (its pid as the driver reports it: the host's pid namespace)."""

    pid: int
    device: int | None
    used_bytes: int | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "device": self.device, "used_bytes": self.used_bytes, "name": self.name}


@dataclass
class Counters:
    """What was read; None means the source did not say (not supported, or not readable)."""

    source: str
    ecc_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remap_failure: bool | None = None
    temperature_c: int | None = None
    xids: list[int] | None = None
    holders: list[Holder] | None = None
    device_state: str | None = None  # XPU: the health/state the tool reports ("ok", "critical", ...)
    notes: list[str] = field(default_factory=list)
    scope: tuple[str, ...] | None = None  # the counters this source can report; None: all of them

    def fields(self) -> dict[str, Any]:
        every = {
            "ecc_uncorrected": self.ecc_uncorrected,
            "retired_pages_pending": self.retired_pages_pending,
            "remapped_rows_pending": self.remapped_rows_pending,
            "remap_failure": self.remap_failure,
            "temperature_c": self.temperature_c,
            "xids": self.xids,
            "holders": None if self.holders is None else [h.to_dict() for h in self.holders],
            "device_state": self.device_state,
        }
        return every if self.scope is None else {k: v for k, v in every.items() if k in self.scope}


def judge(counters: Counters, own_pids: Iterable[int] = ()) -> CheckResult:
    """Counters to a health value; counts in the reason; `unknown` when nothing could be read."""
    values = counters.fields()
    read = [k for k, v in values.items() if v is not None]
    evidence = {"source": counters.source, **values, "notes": list(counters.notes)}
    if not read:
        why = "; ".join(counters.notes) or "no counter could be read"
        reason = f"no health counters from {counters.source}: {why}"
        return CheckResult("counters", Health.UNKNOWN, reason, Action.NONE, evidence=evidence)
    bad: list[str] = []
    warn: list[str] = []
    action = Action.NONE
    if counters.remap_failure:
        bad.append("row remapping failed (no spare rows left)")
        action = Action.INSPECT_HARDWARE
    if counters.device_state is not None and counters.device_state.lower() not in ("ok", "healthy", "unknown"):
        bad.append(f"the driver reports the device as {counters.device_state}")
        action = Action.RESET_DEVICE
    fatal = sorted({x for x in counters.xids or [] if x in FATAL_XIDS})
    if fatal:
        warn.append(f"{plural(len(fatal), 'fatal Xid')} in the kernel log since boot ({', '.join(map(str, fatal))})")
    if counters.ecc_uncorrected:
        warn.append(f"{plural(counters.ecc_uncorrected, 'uncorrected ECC error')} since the last reset")
    if counters.retired_pages_pending or counters.remapped_rows_pending:
        warn.append("memory retirement or row remap is pending until the device is reset")
    if counters.temperature_c is not None and counters.temperature_c > HOT_CELSIUS:
        warn.append(f"temperature {counters.temperature_c} °C is above {HOT_CELSIUS} °C")
    others = [h for h in counters.holders or [] if h.pid not in set(own_pids)]
    if others:
        used = sum(h.used_bytes or 0 for h in others)
        verb = "holds" if len(others) == 1 else "hold"
        warn.append(
            f"{plural(len(others), 'other process', 'other processes')} {verb} the device "
            f"({used / (1 << 30):.1f} GiB; pids {', '.join(str(h.pid) for h in others[:8])})"
        )
    missing = len(values) - len(read)
    tail = f"; {missing} of {len(values)} counters unavailable" if missing else ""
    if bad:
        return CheckResult("counters", Health.UNHEALTHY, "; ".join(bad + warn) + tail, action, evidence=evidence)
    if warn:
        if others and action is Action.NONE and len(warn) == 1:
            action = Action.REAP_PROCESSES
        elif action is Action.NONE:
            action = Action.INSPECT_HARDWARE
        return CheckResult("counters", Health.DEGRADED, "; ".join(warn) + tail, action, evidence=evidence)
    return CheckResult(
        "counters",
        Health.HEALTHY,
        f"{plural(len(read), 'counter')} read from {counters.source}, none out of range{tail}",
        evidence=evidence,
    )


# --- NVIDIA -------------------------------------------------------------------------------------

NvmlLoader = Callable[[], Any]


def load_nvml() -> Any:
    """The `pynvml` module from nvidia-ml-py, initialised; raises ImportError or its NVMLError."""
    import pynvml  # type: ignore[import-not-found,unused-ignore]  # optional: the `cuda` extra (nvidia-ml-py)

    pynvml.nvmlInit()
    return pynvml


def _nvml_try(notes: list[str], what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as error:  # NVMLError_NotSupported and kin: the counter is absent
        notes.append(f"{what}: {error}")
        return None


def nvml_counters(nvml: Any, index: int, uuid: str | None) -> Counters:
    notes: list[str] = []
    handle = nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(index)
    c = Counters(source="NVML", notes=notes, scope=NVIDIA_COUNTERS)
    c.ecc_uncorrected = _nvml_try(
        notes,
        "ECC",
        lambda: int(
            nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        ),
    )
    pending = _nvml_try(notes, "retired pages", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    c.retired_pages_pending = None if pending is None else bool(pending)
    remap = _nvml_try(notes, "remapped rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    if remap is not None:
        c.remapped_rows_pending, c.remap_failure = bool(remap[2]), bool(remap[3])
    c.temperature_c = _nvml_try(
        notes, "temperature", lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    )
    procs = _nvml_try(notes, "compute processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    if procs is not None:
        c.holders = [Holder(int(p.pid), index, getattr(p, "usedGpuMemory", None)) for p in procs]
    return c


_SMI_FIELDS = (
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "temperature.gpu",
)


def _smi_value(text: str) -> str | None:
    text = text.strip()
    return None if not text or text.startswith("[") or text in ("N/A", "Not Supported") else text


def _smi_bool(text: str | None) -> bool | None:
    if text is None:
        return None
    return text.lower() in ("yes", "1", "true", "enabled")


def _smi_int(text: str | None) -> int | None:
    if text is None:
        return None
    with contextlib.suppress(ValueError):
        return int(float(text))
    return None


def smi_counters(index: int, uuid: str | None, runner: CommandRunner = run_command) -> Counters:
    notes: list[str] = []
    c = Counters(source="nvidia-smi", notes=notes, scope=NVIDIA_COUNTERS)
    selector = uuid or str(index)
    values: dict[str, str | None] = {}
    result = runner(
        ["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits", "-i", selector],
        DEFAULT_COMMAND_TIMEOUT_S,
    )
    if result.ok and result.stdout.strip():
        parts = result.stdout.strip().splitlines()[0].split(",")
        values = {f: _smi_value(p) for f, p in zip(_SMI_FIELDS, parts, strict=False)}
    elif result.error is not None or result.timed_out:
        notes.append(result.describe())
        return c
    else:  # an older driver rejects unknown fields as a whole: ask one field at a time
        for name in _SMI_FIELDS:
            one = runner(
                ["nvidia-smi", f"--query-gpu={name}", "--format=csv,noheader,nounits", "-i", selector],
                DEFAULT_COMMAND_TIMEOUT_S,
            )
            values[name] = _smi_value(one.stdout.splitlines()[0]) if one.ok and one.stdout.strip() else None
            if not one.ok:
                notes.append(f"{name}: {one.describe()}")
    c.ecc_uncorrected = _smi_int(values.get("ecc.errors.uncorrected.volatile.total"))
    c.retired_pages_pending = _smi_bool(values.get("retired_pages.pending"))
    c.remapped_rows_pending = _smi_bool(values.get("remapped_rows.pending"))
    c.remap_failure = _smi_bool(values.get("remapped_rows.failure"))
    c.temperature_c = _smi_int(values.get("temperature.gpu"))
    holders = smi_holders(runner)
    if holders is not None:
        wanted = uuid
        c.holders = [h for h, gpu in holders if wanted is None or gpu == wanted]
    else:
        notes.append("compute processes: nvidia-smi --query-compute-apps failed")
    return c


def smi_holders(runner: CommandRunner = run_command) -> list[tuple[Holder, str]] | None:
    """(holder, gpu uuid) for every compute process nvidia-smi lists; None if it cannot say."""
    result = runner(
        ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory,process_name", "--format=csv,noheader,nounits"],
        DEFAULT_COMMAND_TIMEOUT_S,
    )
    if not result.ok:
        return None
    found: list[tuple[Holder, str]] = []
    for line in result.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        used = _smi_int(_smi_value(parts[2]))
        name = parts[3] if len(parts) > 3 else None
        found.append((Holder(int(parts[1]), None, None if used is None else used << 20, name), parts[0]))
    return found


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")


def pci_key(address: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address however it is written: `00000000:18:00.0`, `0000:18:00`."""
    parts = address.strip().lower().split(".")[0].split(":")
    if len(parts) < 2:
        return None
    try:
        domain = int(parts[-3], 16) if len(parts) >= 3 else 0
        return domain, int(parts[-2], 16), int(parts[-1], 16)
    except ValueError:
        return None


def parse_xids(lines: Iterable[str], pci_bus_id: str | None) -> list[int]:
    """Xid numbers from kernel log lines, for one device's PCI address when it is known."""
    want = pci_key(pci_bus_id) if pci_bus_id else None
    found: list[int] = []
    for line in lines:
        match = _XID.search(line)
        if match and (want is None or pci_key(match.group(1)) == want):
            found.append(int(match.group(2)))
    return found


def read_kernel_log(path: str = "/dev/kmsg", max_records: int = KMSG_MAX_RECORDS) -> list[str] | None:
    """The kernel ring buffer, without blocking; None when it cannot be read (no privilege)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    lines: list[str] = []
    try:
        for _ in range(max_records):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as error:
                if error.errno == errno.EPIPE:  # a record was overwritten while reading: go on
                    continue
                break
            if not record:
                break
            lines.append(record.decode(errors="replace").split(";", 1)[-1])
    finally:
        os.close(fd)
    return lines


def cuda_counters(
    index: int,
    *,
    uuid: str | None,
    pci_bus_id: str | None,
    runner: CommandRunner = run_command,
    nvml_loader: NvmlLoader = load_nvml,
    kernel_log: Callable[[], list[str] | None] = read_kernel_log,
) -> Counters:
    try:
        nvml = nvml_loader()
    except ImportError:
        counters = smi_counters(index, uuid, runner)
        counters.notes.insert(0, "NVML unavailable (nvidia-ml-py is not installed)")
    except Exception as error:  # NVMLError from nvmlInit: driver missing or broken
        counters = smi_counters(index, uuid, runner)
        counters.notes.insert(0, f"NVML failed to initialise: {error}")
    else:
        counters = nvml_counters(nvml, index, uuid)
    log = kernel_log()
    if log is None:
        counters.notes.append("Xid history unavailable (the kernel log is not readable here)")
    else:
        counters.xids = parse_xids(log, pci_bus_id)
    return counters


# --- Intel XPU ----------------------------------------------------------------------------------


def _walk(data: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield str(key), value
            yield from _walk(value)
    elif isinstance(data, list):
        for item in data:
            yield from _walk(item)


def parse_xpu_health(text: str) -> str | None:
    """The worst status in `xpu-smi health -j` output ("ok", "warning", "critical", ...)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    rank = {"ok": 0, "healthy": 0, "unknown": 1, "warning": 2, "critical": 3, "failed": 4}
    statuses = [str(v).lower() for k, v in _walk(data) if "status" in k.lower() and isinstance(v, str)]
    statuses = [s for s in statuses if s in rank]
    return max(statuses, key=lambda s: rank[s]) if statuses else None


def parse_xpu_ps(text: str) -> list[Holder] | None:
    """Processes from `xpu-smi ps -j` output."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    holders: list[Holder] = []
    entries = data.get("device_util_by_proc_list", data) if isinstance(data, dict) else data
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or "process_id" not in entry:
            continue
        mem_kib = entry.get("mem_size")
        holders.append(
            Holder(
                int(entry["process_id"]),
                _smi_int(str(entry.get("device_id"))) if entry.get("device_id") is not None else None,
                int(mem_kib) * 1024 if isinstance(mem_kib, int | float) else None,
                str(entry.get("process_name") or "") or None,
            )
        )
    return holders


def xpu_counters(index: int, runner: CommandRunner = run_command) -> Counters:
    notes: list[str] = []
    c = Counters(source="xpu-smi", notes=notes, scope=("device_state", "holders"))
    health = runner(["xpu-smi", "health", "-d", str(index), "-j"], DEFAULT_COMMAND_TIMEOUT_S)
    if health.ok:
        c.device_state = parse_xpu_health(health.stdout)
        if c.device_state is None:
            notes.append("xpu-smi health printed no status")
    else:
        notes.append(health.describe())
    if health.error is None and not health.timed_out:  # installed and answering: ask for processes too
        ps = runner(["xpu-smi", "ps", "-d", str(index), "-j"], DEFAULT_COMMAND_TIMEOUT_S)
        c.holders = parse_xpu_ps(ps.stdout) if ps.ok else None
        if not ps.ok:
            notes.append(ps.describe())
    notes.append("Level Zero Sysman is not read directly (xpu-smi only)")
    return c
