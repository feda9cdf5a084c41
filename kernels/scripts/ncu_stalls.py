"""Summarise an `ncu --page source --csv --print-source sass` export (kernels/scripts/ncu_profile.sh):
warp-stall samples by reason and by opcode, and how often each instruction ran (a loop body shows up as a
block of instructions with the same count).

    python3 kernels/scripts/ncu_stalls.py src-fold.csv [...]
"""

from __future__ import annotations

import collections
import csv
import sys
from pathlib import Path


def _number(cell: str) -> float:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return 0.0


def summarise(path: Path) -> str:
    rows = list(csv.reader(path.open()))
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    by_reason: collections.Counter[str] = collections.Counter()
    by_opcode: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    executed: collections.Counter[str] = collections.Counter()
    runs: collections.Counter[int] = collections.Counter()
    for r in data:
        words = r[col["Source"]].split()
        opcode = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
        count = _number(r[col["Instructions Executed"]])
        executed[opcode] += count
        runs[int(count)] += 1
        by_opcode[opcode]["samples"] += _number(r[col["Warp Stall Sampling (All Samples)"]])
        for reason in reasons:
            by_reason[reason] += _number(r[col[reason]])
            by_opcode[opcode][reason] += _number(r[col[reason]])
    samples = sum(c["samples"] for c in by_opcode.values()) or 1.0
    total = sum(executed.values()) or 1.0
    lines = [f"{path.name}: {samples:.0f} stall samples, {total:.0f} warp instructions executed"]
    lines.append("  reasons: " + ", ".join(f"{k[6:]} {v / samples:.1%}" for k, v in by_reason.most_common(8)))
    lines.append("  instructions by times run (times x count): "
                 + ", ".join(f"{n} x {c}" for n, c in runs.most_common(4)))  # fmt: skip
    for opcode, c in sorted(by_opcode.items(), key=lambda kv: -kv[1]["samples"])[:12]:
        top = ", ".join(f"{k[6:]} {v / samples:.1%}" for k, v in c.most_common(4) if k != "samples")
        share = executed[opcode] / total
        lines.append(f"  {opcode:<8} samples {c['samples'] / samples:6.1%}  executed {share:6.1%}  {top}")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n".join(summarise(Path(p)) for p in sys.argv[1:]))
