"""Where a graphed step's time goes: the kernels of one CUDA-graph replay, from the profiler's timeline.

`bench --trace` replays each case's graph once more under `torch.profiler` (CUPTI records the kernels a graph
launches) and adds `trace_summary` to its JSON row: per layer-step, the span from the first kernel's start to
the last one's end, the time some kernel ran (the union of their intervals), and each kernel's count and time.
The span minus the busy time is the device idle between dependent launches, which a latency-bound step
(B = 1) pays once per launch on its critical path. Streams are only counted: CUPTI reports a graph's kernels
on the streams of the graph's branches, not on the ones they were captured from (H200 run 23: one per layer's
flush branch).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# chrome-trace categories of device activity (kernels, and copies or fills inside the graph)
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class Kernel:
    name: str
    stream: int
    start_us: float
    dur_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def kernels_of(trace: dict[str, Any]) -> list[Kernel]:
    """The device activities of a chrome trace (`torch.profiler`'s `export_chrome_trace`), by start time."""
    found = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or event.get("cat") not in DEVICE_CATEGORIES:
            continue
        stream = event.get("args", {}).get("stream", event.get("tid", 0))
        found.append(Kernel(str(event.get("name", "?")), int(stream), float(event["ts"]), float(event["dur"])))
    return sorted(found, key=lambda k: (k.start_us, k.stream))


def busy_us(kernels: Iterable[Kernel]) -> float:
    """Length of the union of the kernels' intervals."""
    total, end = 0.0, float("-inf")
    for k in sorted(kernels, key=lambda k: k.start_us):
        if k.end_us <= end:
            continue
        total += k.end_us - max(k.start_us, end)
        end = k.end_us
    return total


def short_name(name: str) -> str:
    """A kernel's name without Triton's or CUDA's decorations (template arguments, `void`, parameters)."""
    name = name.removeprefix("void ").split("(")[0].split("<")[0]
    return name.rsplit("::", 1)[-1] or "?"


def trace_summary(kernels: list[Kernel], layer_steps: int) -> dict[str, Any]:
    """Per layer-step (`layer_steps`: steps x layers of the replay): span, busy, idle, and each kernel's count
    and time, longest first; the number of streams. Empty when nothing was recorded."""
    if not kernels:
        return {"kernels": 0}
    per = 1.0 / max(layer_steps, 1)
    span = max(k.end_us for k in kernels) - min(k.start_us for k in kernels)
    busy = busy_us(kernels)
    names: dict[str, list[float]] = {}
    for k in kernels:
        names.setdefault(short_name(k.name), []).append(k.dur_us)
    return {
        "kernels": len(kernels),
        "layer_steps": layer_steps,
        "span_us": round(span * per, 3),
        "busy_us": round(busy * per, 3),
        "idle_us": round((span - busy) * per, 3),
        "streams": len({k.stream for k in kernels}),
        "by_kernel": {
            name: {
                "launches": round(len(durs) * per, 3),
                "us": round(sum(durs) * per, 3),
                "mean_us": round(sum(durs) / len(durs), 3),
            }
            for name, durs in sorted(names.items(), key=lambda item: -sum(item[1]))
        },
    }


def format_summary(label: str, summary: dict[str, Any]) -> str:
    """`trace_summary` as comment lines for a terminal."""
    if not summary.get("kernels"):
        return f"# trace {label}: the profiler recorded no kernel of the replay"
    lines = [
        f"# trace {label}: per layer-step {summary['span_us']:.2f} us span, {summary['busy_us']:.2f} us some kernel "
        f"running, {summary['idle_us']:.2f} us idle ({summary['kernels']} kernels on {summary['streams']} streams, "
        f"{summary['layer_steps']} layer-steps)"
    ]
    for name, k in summary["by_kernel"].items():
        lines.append(f"#   {name}: {k['launches']:.2f} launches, {k['us']:.2f} us (mean {k['mean_us']:.2f} us)")
    return "\n".join(lines)


def profile_kernels(run: Callable[[], None], synchronize: Callable[[], None]) -> list[Kernel]:
    """The device activities of one `run()` (a graph replay), through `torch.profiler` and its chrome trace."""
    from torch.profiler import ProfilerActivity, profile, supported_activities

    # the host activity too: without CUDA (the tests) the profiler refuses an empty list
    activities = [a for a in (ProfilerActivity.CPU, ProfilerActivity.CUDA) if a in supported_activities()]
    synchronize()
    with profile(activities=activities) as prof:
        run()
        synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return kernels_of(trace)
