"""Platform backends, one interface: discover devices, the environment that confines a process to
chosen devices, the processes holding a device, and where health counters come from.

The parent never imports torch or touches a device: discovery asks a vendor tool under a timeout
(`nvidia-smi`, `xpu-smi`) and falls back to a `discover` worker; probes and collectives run in
workers (see `probe`). The same interface serves `sim`, whose devices are CPU processes with the
profile's faults injected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from preflight.child import Child, Ended, Timeout, worker_argv, worker_env
from preflight.commands import DEFAULT_COMMAND_TIMEOUT_S, CommandRunner, run_command
from preflight.counters import Holder, parse_xpu_ps, smi_holders
from preflight.faults import Fault
from preflight.host import host_device_name
from preflight.platforms import ConcretePlatform, device_environment

# Floors below which an all-reduce counts as a slow link, in GB/s of bus bandwidth, when the profile
# sets none. They only catch links that are broken outright (a healthy PCIe host does ~15 GB/s,
# NVLink 150-480); calibrate `preflight.min_busbw_gbps` at ~80 % of a known-good run per host.
DEFAULT_MIN_BUSBW_GBPS: dict[str, float] = {"cuda": 5.0, "xpu": 2.0, "cpu": 0.0, "sim": 0.05}


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id}


@dataclass(frozen=True)
class Discovery:
    devices: tuple[DeviceInfo, ...]
    source: str
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "count": len(self.devices), "notes": list(self.notes)}


class Backend(Protocol):
    name: ConcretePlatform
    collective_backend: str

    def discover(self) -> Discovery: ...

    def device_environment(self, devices: Sequence[int]) -> dict[str, str]: ...

    def holders(self, device: int) -> list[Holder] | None: ...

    def worker_args(self) -> list[str]: ...


def discover_with_worker(platform: str, timeout_s: float, extra_env: Mapping[str, str] | None = None) -> Discovery:
    """Ask torch in a child process which devices it sees (no vendor tool needed)."""
    child = Child(worker_argv("discover", "--platform", platform), worker_env(dict(extra_env or {})), "discover")
    deadline = child.started_at + timeout_s
    while True:
        event = child.next_event(deadline)
        if isinstance(event, Timeout):
            child.kill()
            return Discovery((), "torch", (f"the discovery worker did not answer within {timeout_s:.0f} s",))
        if isinstance(event, Ended):
            child.finish(1.0)
            tail = child.stderr_tail(3).strip().splitlines()[-1:] or ["no output"]
            return Discovery((), "torch", (f"the discovery worker exited without a list: {tail[0]}",))
        if event.get("event") == "fatal":
            child.kill()
            return Discovery((), "torch", (str(event.get("reason")),))
        if event.get("event") == "devices":
            child.finish(5.0)
            found = tuple(
                DeviceInfo(int(d["index"]), str(d["name"]), d.get("uuid"), d.get("pci_bus_id"))
                for d in event["devices"]
            )
            return Discovery(found, "torch")


@dataclass
class SimBackend:
    """N devices emulated by CPU processes; faults from the profile are injected into the workers."""

    devices: int = 4
    faults: Sequence[Fault] = ()
    name: ConcretePlatform = "sim"
    collective_backend: str = "gloo"

    def discover(self) -> Discovery:
        found = tuple(DeviceInfo(i, host_device_name("sim", i)) for i in range(self.devices))
        return Discovery(found, "sim", (f"{len(self.faults)} faults injected",) if self.faults else ())

    def device_environment(self, devices: Sequence[int]) -> dict[str, str]:
        return {}  # CPU memory has nothing to mask; which device a worker plays is on its command line

    def holders(self, device: int) -> list[Holder] | None:
        return []

    def worker_args(self) -> list[str]:
        return [arg for fault in self.faults for arg in ("--fault", fault.encode())]


@dataclass
class CpuBackend:
    """The host CPU as one device (development and CI)."""

    name: ConcretePlatform = "cpu"
    collective_backend: str = "gloo"

    def discover(self) -> Discovery:
        return Discovery((DeviceInfo(0, host_device_name("cpu", 0)),), "host")

    def device_environment(self, devices: Sequence[int]) -> dict[str, str]:
        return {}

    def holders(self, device: int) -> list[Holder] | None:
        return []

    def worker_args(self) -> list[str]:
        return []


@dataclass
class CudaBackend:
    """NVIDIA: `nvidia-smi` lists the GPUs (falling back to torch), `CUDA_VISIBLE_DEVICES` masks."""

    runner: CommandRunner = run_command
    discover_timeout_s: float = 120.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    name: ConcretePlatform = "cuda"
    collective_backend: str = "nccl"

    def discover(self) -> Discovery:
        result = self.runner(
            ["nvidia-smi", "--query-gpu=index,name,uuid,pci.bus_id", "--format=csv,noheader"],
            DEFAULT_COMMAND_TIMEOUT_S,
        )
        if result.ok:
            found = []
            for line in result.stdout.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) >= 4 and parts[0].isdigit():
                    found.append(DeviceInfo(int(parts[0]), parts[1], parts[2], parts[3].lower()))
            if found:
                return Discovery(tuple(found), "nvidia-smi")
        fallback = discover_with_worker("cuda", self.discover_timeout_s, self.extra_env)
        return Discovery(fallback.devices, fallback.source, (result.describe(), *fallback.notes))

    def device_environment(self, devices: Sequence[int]) -> dict[str, str]:
        return device_environment("cuda", devices)

    def holders(self, device: int) -> list[Holder] | None:
        listed = smi_holders(self.runner)
        if listed is None:
            return None
        uuids = {d.index: d.uuid for d in self.discover().devices}
        return [Holder(h.pid, device, h.used_bytes, h.name) for h, gpu in listed if gpu == uuids.get(device)]

    def worker_args(self) -> list[str]:
        return []


def parse_xpu_discovery(text: str) -> tuple[DeviceInfo, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return ()
    found = []
    for entry in data.get("device_list", []) if isinstance(data, dict) else []:
        if isinstance(entry, dict) and isinstance(entry.get("device_id"), int):
            found.append(
                DeviceInfo(
                    entry["device_id"],
                    str(entry.get("device_name", "Intel GPU")),
                    entry.get("uuid"),
                    entry.get("pci_bdf_address"),
                )
            )
    return tuple(sorted(found, key=lambda d: d.index))


@dataclass
class XpuBackend:
    """Intel XPU: `xpu-smi discovery` (falling back to torch.xpu); ZE_AFFINITY_MASK and
    ONEAPI_DEVICE_SELECTOR mask. Collectives see the whole group in every rank: per-process masks
    break cross-process oneCCL (vllm#53076)."""

    runner: CommandRunner = run_command
    discover_timeout_s: float = 120.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    name: ConcretePlatform = "xpu"
    collective_backend: str = "xccl"

    def discover(self) -> Discovery:
        result = self.runner(["xpu-smi", "discovery", "-j"], DEFAULT_COMMAND_TIMEOUT_S)
        if result.ok:
            found = parse_xpu_discovery(result.stdout)
            if found:
                return Discovery(found, "xpu-smi")
        fallback = discover_with_worker("xpu", self.discover_timeout_s, self.extra_env)
        return Discovery(fallback.devices, fallback.source, (result.describe(), *fallback.notes))

    def device_environment(self, devices: Sequence[int]) -> dict[str, str]:
        return device_environment("xpu", devices)

    def holders(self, device: int) -> list[Holder] | None:
        result = self.runner(["xpu-smi", "ps", "-d", str(device), "-j"], DEFAULT_COMMAND_TIMEOUT_S)
        return parse_xpu_ps(result.stdout) if result.ok else None

    def worker_args(self) -> list[str]:
        return []


def make_backend(
    platform: ConcretePlatform,
    *,
    sim_devices: int = 4,
    faults: Sequence[Fault] = (),
    runner: CommandRunner = run_command,
    discover_timeout_s: float = 120.0,
    extra_env: Mapping[str, str] | None = None,
) -> Backend:
    if faults and platform != "sim":
        raise ValueError("faults can only be injected on the sim platform")
    env = dict(extra_env or {})
    if platform == "sim":
        return SimBackend(sim_devices, tuple(faults))
    if platform == "cpu":
        return CpuBackend()
    if platform == "cuda":
        return CudaBackend(runner, discover_timeout_s, env)
    return XpuBackend(runner, discover_timeout_s, env)
