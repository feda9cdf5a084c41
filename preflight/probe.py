"""The probe worker, run as a child process: `python -m preflight.probe MODE --platform P ...`.

Modes:
- `device`: run the device probes on one device (the parent masks the process to it) and report
  each result as it finishes, so the parent knows which probe was running when it had to kill us.
- `collective`: import torch, say `ready`, wait for one command on stdin, then join an all-reduce
  as one rank and report correctness and timing. Waiting first lets the parent start the workers
  while the device probes still run.
- `discover`: list the devices torch sees (used when no vendor tool can list them).

Protocol: one JSON object per line on the original stdout; everything else anything prints goes
to stderr. Events: `hello`, `ready`, `begin {check}`, `result {CheckResult}`, `devices`, `fatal`,
`done`. Only this module and the modules it imports run in the worker; none of them needs
pydantic, yaml or prometheus_client.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, Any

from preflight.counters import cuda_counters, judge, xpu_counters
from preflight.failures import ACTIONS, Failure, classify_text
from preflight.faults import Fault, Injector
from preflight.health import Action, CheckResult, Health, plural
from preflight.host import host_device_name, host_memory_bytes
from preflight.levels import FUNCTIONAL_PROBES, LEVELS, MIB, Sizes, sizes_for

PLATFORMS = ("cuda", "xpu", "cpu", "sim")


class Emitter:
    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def __call__(self, event: str, **fields: Any) -> None:
        self._stream.write(json.dumps({"event": event, **fields}, default=str) + "\n")
        self._stream.flush()


def protocol_stream() -> IO[str]:
    """Keep the real stdout for events and send fd 1 to stderr, so no library print breaks a line."""
    private = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(private, "w", buffering=1)


class WorkerDevice:
    """The device this worker drives, whatever the platform; CPU memory for `cpu` and `sim`."""

    def __init__(self, torch: Any, platform: str, local_index: int) -> None:
        self.torch = torch
        self.platform = platform
        self.kind = platform if platform in ("cuda", "xpu") else "cpu"
        self.accelerator = self.kind != "cpu"
        self.module: Any = getattr(torch, self.kind) if self.accelerator else None
        self.device = torch.device(self.kind, local_index) if self.accelerator else torch.device("cpu")

    def count(self) -> int:
        if not self.accelerator:
            return 1
        return int(self.module.device_count()) if self.module.is_available() else 0

    def set_current(self) -> None:
        if self.accelerator:
            self.module.set_device(self.device)

    def synchronize(self) -> None:
        if self.accelerator:
            self.module.synchronize(self.device)

    def properties(self, index: int) -> dict[str, Any]:
        if not self.accelerator:
            return {"name": host_device_name(self.platform, index), "total_memory_bytes": host_memory_bytes()}
        props = self.module.get_device_properties(self.device)
        found: dict[str, Any] = {"name": str(props.name), "total_memory_bytes": int(props.total_memory)}
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            text = str(uuid)
            found["uuid"] = text if text.startswith("GPU-") or self.kind != "cuda" else f"GPU-{text}"
        bus = getattr(props, "pci_bus_id", None)
        if isinstance(bus, int):
            domain = getattr(props, "pci_domain_id", 0) or 0
            dev = getattr(props, "pci_device_id", 0) or 0
            found["pci_bus_id"] = f"{domain:08x}:{bus:02x}:{dev:02x}.0"
        return found

    def dist_backend(self) -> str:
        return {"cuda": "nccl", "xpu": "xccl"}.get(self.kind, "gloo")


@dataclass
class Context:
    torch: Any
    np: Any | None
    dev: WorkerDevice
    platform: str
    index: int
    sizes: Sizes
    injector: Injector
    expect_name: str | None = None
    found: dict[str, Any] = field(default_factory=dict)


def _ok(check: str, reason: str, **evidence: Any) -> CheckResult:
    return CheckResult(check, Health.HEALTHY, reason, Action.NONE, evidence=evidence)


def _failed(check: str, failure: Failure, reason: str, **evidence: Any) -> CheckResult:
    evidence = {"failure": failure.value, **evidence}
    return CheckResult(check, Health.UNHEALTHY, reason, ACTIONS[failure], evidence=evidence)


def probe_enumerate(ctx: Context) -> CheckResult:
    ctx.injector.at("enumerate")
    count = ctx.dev.count()
    mask = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK") if k in os.environ}
    if count == 0:
        return _failed(
            "enumerate",
            Failure.MISSING,
            f"torch {ctx.torch.__version__} sees no {ctx.dev.kind} device (mask {mask or 'none'})",
            mask=mask,
        )
    props = ctx.dev.properties(ctx.index)
    ctx.found.update(props)
    evidence = {"visible": count, "mask": mask, "torch": ctx.torch.__version__, **props}
    name = props["name"]
    memory = f"{props['total_memory_bytes'] / (1 << 30):.1f} GiB"
    if ctx.dev.accelerator and count != 1:
        return CheckResult(
            "enumerate",
            Health.DEGRADED,
            f"the mask should leave 1 device visible but torch sees {count}; probing the first, {name}",
            Action.CHECK_SOFTWARE,
            evidence=evidence,
        )
    expected = (ctx.expect_name or "").lower()
    if expected and expected not in name.lower() and name.lower() not in expected:
        return CheckResult(
            "enumerate",
            Health.DEGRADED,
            f"torch names device {ctx.index} {name!r} but discovery listed {ctx.expect_name!r} (index order differs?)",
            Action.CHECK_SOFTWARE,
            evidence=evidence,
        )
    return _ok("enumerate", f"{name}, {memory}", **evidence)


def probe_counters(ctx: Context) -> CheckResult:
    own = [os.getpid()]
    if ctx.platform == "cuda":
        counters = cuda_counters(ctx.index, uuid=ctx.found.get("uuid"), pci_bus_id=ctx.found.get("pci_bus_id"))
        return judge(counters, own)
    if ctx.platform == "xpu":
        return judge(xpu_counters(ctx.index), own)
    what = "a simulated device" if ctx.platform == "sim" else "the CPU platform"
    return CheckResult("counters", Health.UNKNOWN, f"{what} has no health counters", Action.NONE)


def probe_allocate(ctx: Context) -> CheckResult:
    torch = ctx.torch
    nbytes = ctx.sizes.alloc_bytes
    ctx.injector.at("allocate")
    start = time.perf_counter()
    block = torch.empty(nbytes, dtype=torch.uint8, device=ctx.dev.device)
    block.fill_(0xA5)
    ctx.dev.synchronize()
    stride = max(1, nbytes // 4096)
    sample = block[::stride].to("cpu")
    wrong = int((sample != 0xA5).sum())
    elapsed = time.perf_counter() - start
    del block, sample
    if wrong:
        return _failed(
            "allocate",
            Failure.WRONG_RESULT,
            f"{plural(wrong, 'sampled byte')} of {nbytes // stride} read back wrong after filling {nbytes // MIB} MiB",
            bytes=nbytes,
        )
    return _ok("allocate", f"allocated and filled {nbytes // MIB} MiB in {elapsed:.3f} s", bytes=nbytes)


def _round_trip(ctx: Context, host: Any, pinned: bool) -> tuple[int, float, float]:
    """Host→device→host; returns (differing bytes, h2d seconds, d2h seconds)."""
    dev = ctx.dev
    source = host.pin_memory() if pinned else host
    start = time.perf_counter()
    on_device = source.to(dev.device, non_blocking=pinned, copy=True)
    dev.synchronize()
    h2d = time.perf_counter() - start
    start = time.perf_counter()
    back = on_device.to("cpu", copy=True)
    dev.synchronize()
    d2h = time.perf_counter() - start
    return int((back != host).sum()), h2d, d2h


def probe_copy(ctx: Context) -> CheckResult:
    torch, nbytes = ctx.torch, ctx.sizes.copy_bytes
    paths: dict[str, dict[str, float]] = {}
    if ctx.np is not None:
        data = ctx.np.random.default_rng(ctx.index).integers(0, 256, size=nbytes, dtype=ctx.np.uint8)
        host = torch.from_numpy(data)  # the path that hit DEVICE_LOST in the seeds
        ctx.injector.at("copy")
        wrong, h2d, d2h = _round_trip(ctx, host, pinned=False)
        paths["from_numpy"] = {"wrong_bytes": wrong, "h2d_s": h2d, "d2h_s": d2h}
    else:
        host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(ctx.index))
        ctx.injector.at("copy")
    if ctx.dev.accelerator:
        wrong, h2d, d2h = _round_trip(ctx, host, pinned=True)
        paths["pinned"] = {"wrong_bytes": wrong, "h2d_s": h2d, "d2h_s": d2h}
    elif not paths:
        wrong, h2d, d2h = _round_trip(ctx, host, pinned=False)
        paths["tensor"] = {"wrong_bytes": wrong, "h2d_s": h2d, "d2h_s": d2h}
    wrong_total = sum(int(p["wrong_bytes"]) for p in paths.values())
    best = min(paths.values(), key=lambda p: p["h2d_s"] + p["d2h_s"])
    h2d_gbps = nbytes / max(best["h2d_s"], 1e-9) / 1e9
    d2h_gbps = nbytes / max(best["d2h_s"], 1e-9) / 1e9
    evidence = {"bytes": nbytes, "paths": paths, "h2d_gbps": round(h2d_gbps, 3), "d2h_gbps": round(d2h_gbps, 3)}
    if wrong_total:
        return _failed(
            "copy",
            Failure.WRONG_RESULT,
            f"{plural(wrong_total, 'byte')} of {nbytes * len(paths)} differ after host→device→host round trips",
            **evidence,
        )
    missing = "" if ctx.np is not None else "; numpy is missing, so the from_numpy path was not exercised"
    return _ok(
        "copy",
        f"{nbytes // MIB} MiB host→device→host on {plural(len(paths), 'path')} ({', '.join(paths)}), "
        f"0 bytes differ; h2d {h2d_gbps:.1f} GB/s, d2h {d2h_gbps:.1f} GB/s{missing}",
        **evidence,
    )


def _integer_matrices(torch: Any, n: int, seed: int) -> tuple[Any, Any]:
    # Small integers: every product and sum is exact in fp32 (and tf32), so device == CPU exactly.
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(-4, 5, (n, n), generator=gen).float()
    b = torch.randint(-4, 5, (n, n), generator=gen).float()
    return a, b


def probe_compute(ctx: Context) -> CheckResult:
    torch, n = ctx.torch, ctx.sizes.matmul_n
    a, b = _integer_matrices(torch, n, 1234 + ctx.index)
    expected = a @ b + 1
    ctx.injector.at("compute")
    da, db = a.to(ctx.dev.device), b.to(ctx.dev.device)
    out = da @ db + 1
    for _ in range(ctx.sizes.compute_iterations - 1):
        out = da @ db + 1
    ctx.injector.corrupt(out, "compute")
    got = out.to("cpu", copy=True)
    ctx.dev.synchronize()
    wrong = int((got != expected).sum())
    if wrong:
        error = float((got - expected).abs().max())
        return _failed(
            "compute",
            Failure.WRONG_RESULT,
            f"compute checksum: {wrong} of {n * n} elements differ from the CPU result (max error {error:g})",
            wrong_elements=wrong,
            elements=n * n,
        )
    return _ok(
        "compute",
        f"{n}x{n} matmul+add x{ctx.sizes.compute_iterations} matches the CPU result exactly",
        elements=n * n,
    )


def probe_graph(ctx: Context) -> CheckResult:
    torch, dev = ctx.torch, ctx.dev
    graph_class = getattr(dev.module, "CUDAGraph" if dev.kind == "cuda" else "XPUGraph", None)
    graph_context = getattr(dev.module, "graph", None)
    if graph_class is None or graph_context is None:
        return CheckResult(
            "graph", Health.UNKNOWN, f"torch {torch.__version__} has no {dev.kind} graph API", Action.NONE
        )
    n = min(ctx.sizes.matmul_n, 512)
    replays = max(1, ctx.sizes.graph_replays)
    inputs = [_integer_matrices(torch, n, 99 + r)[0] for r in range(replays)]
    weight, _ = _integer_matrices(torch, n, 7)
    static_x = inputs[0].to(dev.device)
    w = weight.to(dev.device)
    side = dev.module.Stream()
    side.wait_stream(dev.module.current_stream())
    with dev.module.stream(side):
        for _ in range(2):  # warm up outside capture, as the graph API requires
            static_x @ w + 1
    dev.module.current_stream().wait_stream(side)
    graph = graph_class()
    with graph_context(graph):
        static_y = static_x @ w + 1
    wrong = 0
    for x in inputs:
        static_x.copy_(x.to(dev.device))
        graph.replay()
        dev.synchronize()
        wrong += int((static_y.to("cpu") != x @ weight + 1).sum())
    if wrong:
        return _failed(
            "graph",
            Failure.WRONG_RESULT,
            f"graph replay: {wrong} of {n * n * replays} elements differ from the CPU result over "
            f"{plural(replays, 'replay')}",
            replays=replays,
        )
    return _ok("graph", f"captured a {n}x{n} matmul+add and replayed it {replays}x with exact results", replays=replays)


PROBES: dict[str, Callable[[Context], CheckResult]] = {
    "enumerate": probe_enumerate,
    "counters": probe_counters,
    "allocate": probe_allocate,
    "copy": probe_copy,
    "compute": probe_compute,
    "graph": probe_graph,
}


def result_from_exception(check: str, error: BaseException) -> CheckResult:
    text = f"{type(error).__name__}: {error}"
    failure = classify_text(text) or Failure.ERROR
    what = {Failure.DEVICE_LOST: "device lost", Failure.ALLOC_FAIL: "allocation failed"}.get(failure, "failed")
    return _failed(check, failure, f"{check} {what}: {text[:400]}", error=text[:2000])


def run_device(args: argparse.Namespace, emit: Emitter, torch: Any) -> int:
    np: Any
    try:
        import numpy as np
    except ImportError:
        np = None
    dev = WorkerDevice(torch, args.platform, 0)
    faults = [Fault.parse(f) for f in args.fault]
    ctx = Context(
        torch=torch,
        np=np,
        dev=dev,
        platform=args.platform,
        index=args.index,
        sizes=sizes_for(args.level, args.platform),
        injector=Injector(faults, args.index, "probe"),
        expect_name=args.expect_name,
    )
    for check in args.probes.split(","):
        emit("begin", check=check)
        start = time.perf_counter()
        try:
            result = PROBES[check](ctx)
        except Exception as error:  # a probe's failure is a result, not a crash
            result = result_from_exception(check, error)
        result = CheckResult(
            result.check, result.health, result.reason, result.action, time.perf_counter() - start, result.evidence
        )
        emit("result", **result.to_dict())
        if check in FUNCTIONAL_PROBES and result.health is Health.UNHEALTHY:
            break
    return 0


def all_reduce(torch: Any, dev: WorkerDevice, injector: Injector, command: dict[str, Any]) -> dict[str, Any]:
    """One rank of the all-reduce check: correctness before and after a timed loop at one size."""
    import torch.distributed as dist

    rank, world = int(command["rank"]), int(command["world"])
    elements = max(1, int(command["bytes"]) // 4)
    dev.set_current()
    start = time.perf_counter()
    options: dict[str, Any] = {}
    if command["backend"] == "nccl":
        options["device_id"] = dev.device
    dist.init_process_group(
        command["backend"],
        store=dist.FileStore(command["store"], world),  # type: ignore[attr-defined]  # not re-exported in stubs
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=float(command["timeout_s"])),
        **options,
    )
    init_s = time.perf_counter() - start
    injector.at(None)  # a simulated fault strikes once the group exists, as a real one would
    expected = world * (world + 1) / 2

    def checked_round() -> int:
        buf = torch.full((elements,), float(rank + 1), dtype=torch.float32, device=dev.device)
        injector.corrupt(buf, None)
        time.sleep(injector.link_delay(elements * 4))
        dist.all_reduce(buf)
        dev.synchronize()
        return int((buf != expected).sum())

    try:
        wrong = checked_round()
        buf = torch.zeros(elements, dtype=torch.float32, device=dev.device)
        for _ in range(int(command["warmup"])):
            time.sleep(injector.link_delay(elements * 4))
            dist.all_reduce(buf)
        dev.synchronize()
        dist.all_reduce(torch.ones(1, device=dev.device))  # line the ranks up before timing
        dev.synchronize()
        iters = int(command["iters"])
        start = time.perf_counter()
        for _ in range(iters):
            time.sleep(injector.link_delay(elements * 4))
            dist.all_reduce(buf)
        dev.synchronize()
        per_iter = (time.perf_counter() - start) / iters
        wrong += checked_round()
    finally:
        dist.destroy_process_group()
    return {
        "rank": rank,
        "world": world,
        "device": command["device"],
        "bytes": elements * 4,
        "iters": iters,
        "time_s": per_iter,
        "init_s": init_s,
        "wrong_elements": wrong,
        "checked_elements": 2 * elements,
    }


def run_collective(args: argparse.Namespace, emit: Emitter, torch: Any) -> int:
    """Serve all-reduce commands until stdin closes; a rank that fails takes no more work."""
    faults = [Fault.parse(f) for f in args.fault]
    while True:
        line = sys.stdin.readline()
        if not line.strip():
            return 0  # dismissed: the parent needs this worker no more
        command = json.loads(line)
        if command.get("cmd") != "all_reduce":
            return 0
        dev = WorkerDevice(torch, args.platform, int(command["local_index"]))
        injector = Injector(faults, int(command["device"]), "collective")
        emit("begin", check="collective")
        start = time.perf_counter()
        try:
            evidence = all_reduce(torch, dev, injector, command)
        except Exception as error:  # reported to the parent, which judges the group
            failed = result_from_exception("collective", error)
            evidence = {**failed.evidence, "rank": command["rank"]}
            took = time.perf_counter() - start
            result = CheckResult(failed.check, failed.health, failed.reason, failed.action, took, evidence)
            emit("result", **result.to_dict())
            return 1
        emit("result", **_ok("collective", "rank finished", **evidence).to_dict())


def run_discover(args: argparse.Namespace, emit: Emitter, torch: Any) -> int:
    devices = []
    probe = WorkerDevice(torch, args.platform, 0)
    for i in range(probe.count()):
        devices.append({"index": i, **WorkerDevice(torch, args.platform, i).properties(i)})
    emit("devices", devices=devices)
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m preflight.probe", description="warden preflight probe worker")
    parser.add_argument("mode", choices=("device", "collective", "discover"))
    parser.add_argument("--platform", choices=PLATFORMS, required=True)
    parser.add_argument("--index", type=int, default=0, help="the device's index on the host (device mode)")
    parser.add_argument("--level", choices=LEVELS, default="quick")
    parser.add_argument("--probes", default="enumerate,counters,allocate,copy,compute")
    parser.add_argument("--expect-name", default=None)
    parser.add_argument("--fault", action="append", default=[], help="sim only: DEVICE:KIND[:DURING]")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    emit = Emitter(protocol_stream())
    faulthandler.enable()
    emit("hello", pid=os.getpid())
    args = parse_args(argv)
    if args.fault and args.platform != "sim":
        emit("fatal", reason="faults can only be injected on the sim platform")
        return 2
    start = time.perf_counter()
    try:
        import torch
    except Exception as error:  # ImportError or a broken build: the device is unknown
        emit("fatal", reason=f"torch cannot be imported: {type(error).__name__}: {error}")
        return 2
    emit("ready", torch=torch.__version__, startup_s=round(time.perf_counter() - start, 3))
    runner = {"device": run_device, "collective": run_collective, "discover": run_discover}[args.mode]
    code = runner(args, emit, torch)
    emit("done")
    return code


if __name__ == "__main__":
    sys.exit(main())
